#!/bin/sh
# Creates the roles docker-compose.yml needs, and the ledger's database. The postgres image runs
# this once, when the `postgresql` service initialises an empty data directory (a later change here
# needs `docker compose down -v`, which deletes the data).
#
#   temporal   may create databases: Temporal's own schema tool (the `temporal-schema` job) creates
#              temporal and temporal_visibility, which it then owns, and sets up their schemas
#   onceflow   owns the database onceflow, the tool-execution ledger; the worker's migrations
#              create its tables at start-up
#
# Each application has its own role and owns only its own databases; the superuser stays with the
# administrator. (A data directory made by an earlier version of this script, whose `temporal` role
# could not create databases but already owns both, needs `ALTER ROLE temporal CREATEDB` once.)
set -eu

: "${TEMPORAL_DB_PASSWORD:?set TEMPORAL_DB_PASSWORD on the postgresql service}"
: "${ONCEFLOW_DB_PASSWORD:?set ONCEFLOW_DB_PASSWORD on the postgresql service}"

psql --no-psqlrc -v ON_ERROR_STOP=1 \
    --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}" \
    -v temporal_password="$TEMPORAL_DB_PASSWORD" \
    -v onceflow_password="$ONCEFLOW_DB_PASSWORD" <<'SQL'
-- Temporal's visibility schema creates the btree_gin extension; it is a trusted extension
-- (PostgreSQL 13+), so the owner of temporal_visibility may create it without being a superuser.
CREATE ROLE temporal LOGIN CREATEDB PASSWORD :'temporal_password';

CREATE ROLE onceflow LOGIN PASSWORD :'onceflow_password';
CREATE DATABASE onceflow OWNER onceflow;
SQL
