#!/bin/sh
# Creates Temporal's two databases (if missing) and brings their schemas to the version of this
# image, with Temporal's own schema tool. Runs in the temporalio/admin-tools image of the same
# version as the server (docker-compose.yml's `temporal-schema` job), before the server starts.
#
#   create         CREATE DATABASE; a database that already exists is left as it is
#   setup-schema   the schema-version tables, at version 0.0; skipped once a schema is newer
#   update-schema  every versioned step above the current version, in order; none if current
#
# So it is safe at every `docker compose up`, and after an image upgrade it upgrades the schemas
# before the new server touches them. Connection: SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER and
# SQL_PASSWORD (temporal-sql-tool reads the password from SQL_PASSWORD itself, so it never shows
# on a command line); databases: DBNAME and VISIBILITY_DBNAME, the names the server is given.
set -eu

: "${SQL_HOST:?set SQL_HOST, the PostgreSQL host}"
: "${SQL_USER:?set SQL_USER, the role that owns Temporal's databases}"
: "${SQL_PASSWORD:?set SQL_PASSWORD}"
plugin="${SQL_PLUGIN:-postgres12}"
port="${SQL_PORT:-5432}"
schemas=/etc/temporal/schema/postgresql/v12

sql_tool() {
    temporal-sql-tool --plugin "$plugin" --ep "$SQL_HOST" -p "$port" -u "$SQL_USER" "$@"
}

# database name, then the folder of its versioned schema (temporal or visibility)
for pair in "${DBNAME:-temporal}:temporal" "${VISIBILITY_DBNAME:-temporal_visibility}:visibility"; do
    database="${pair%%:*}"
    store="${pair#*:}"
    echo "Temporal $store store: database $database on $SQL_HOST:$port"
    sql_tool --db "$database" create
    sql_tool --db "$database" setup-schema -v 0.0
    sql_tool --db "$database" update-schema -d "$schemas/$store/versioned"
done
echo "Temporal schemas are current"
