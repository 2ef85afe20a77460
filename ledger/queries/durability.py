"""What the durability check reads from the ledger's server (ledger/durability.py). Read-only."""

# The server settings that decide whether an acknowledged commit survives a crash or a failover, and
# the ones the ledger sets on its own connections, as this connection sees them.
SETTINGS = """
SELECT name, setting FROM pg_settings
 WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'synchronous_standby_names',
                'default_transaction_isolation', 'transaction_isolation', 'tcp_keepalives_idle',
                'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout',
                'client_connection_check_interval',
                'data_checksums', 'wal_level')
"""

# The database's own default isolation (ALTER DATABASE/ROLE ... SET), before the ledger's SET.
DEFAULT_ISOLATION = """
SELECT coalesce(
    (SELECT substring(setting FROM '=(.*)$')
       FROM pg_db_role_setting s, unnest(s.setconfig) AS setting
      WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
        AND s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = current_user))
        AND setting LIKE 'default_transaction_isolation=%'
      ORDER BY s.setrole DESC, s.setdatabase DESC
      LIMIT 1),
    (SELECT boot_val FROM pg_settings WHERE name = 'default_transaction_isolation'))
"""

# Standbys streaming from this server and how they count for synchronous commit. sync_state is
# NULL for a role without pg_monitor (or pg_read_all_stats): "cannot tell", not "none".
STANDBYS = """
SELECT application_name, state, sync_state FROM pg_stat_replication
"""

# Is this a standby (the DSN reached a read-only server)?
IN_RECOVERY = "SELECT pg_is_in_recovery()"

# Over TCP or a Unix socket? (NULL: a Unix socket; keepalives have no effect there.)
CLIENT_ADDRESS = "SELECT inet_client_addr()::text"

BACKEND_PID = "SELECT pg_backend_pid()"
