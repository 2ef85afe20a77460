#!/bin/sh
# Creates the databases docker-compose.yml needs. The postgres image runs this once, when the
# `postgresql` service initialises an empty data directory (a later change here needs
# `docker compose down -v`, which deletes the data).
#
#   temporal, temporal_visibility   Temporal's persistence and visibility, owned by role `temporal`
#   onceflow                        the tool-execution ledger, owned by role `onceflow`
#
# Each application has its own role and owns only its own databases; the superuser stays with the
# administrator. Temporal's schema and the ledger's tables are created later by their owners
# (temporalio/auto-setup, and the worker's migrations at start-up).
set -eu

: "${TEMPORAL_DB_PASSWORD:?set TEMPORAL_DB_PASSWORD on the postgresql service}"
: "${ONCEFLOW_DB_PASSWORD:?set ONCEFLOW_DB_PASSWORD on the postgresql service}"

psql --no-psqlrc -v ON_ERROR_STOP=1 \
    --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}" \
    -v temporal_password="$TEMPORAL_DB_PASSWORD" \
    -v onceflow_password="$ONCEFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;

CREATE ROLE onceflow LOGIN PASSWORD :'onceflow_password';
CREATE DATABASE onceflow OWNER onceflow;

-- Temporal's SQL visibility schema creates btree_gin if it is missing; create it here as the
-- superuser so schema set-up never depends on the `temporal` role's privileges.
\connect temporal_visibility
CREATE EXTENSION IF NOT EXISTS btree_gin;
SQL
