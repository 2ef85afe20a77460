#!/bin/sh
# Registers onceflow's search attributes on a Temporal namespace. One-shot and idempotent: an
# attribute that already exists with the same type counts as done; one that exists with another
# type is an error (the Temporal UI could not filter on it the way onceflow writes it).
#
#   register-search-attributes.sh Name=Type [Name=Type ...]
#
# Reads TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE, the same variables the worker reads. Runs in the
# temporalio/admin-tools image (docker-compose.yml's `register-search-attributes` service), which
# has the `temporal` CLI. The worker registers missing attributes too; doing it here first makes
# runs filterable in the UI before any worker has started, and lets workers run with fewer rights.
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: $0 Name=Type [Name=Type ...]" >&2
    exit 2
fi

TEMPORAL_ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"
namespace="${TEMPORAL_NAMESPACE:-default}"
attempts="${REGISTER_ATTEMPTS:-60}"
export TEMPORAL_ADDRESS

# docker-compose.yml's create-namespace job runs first; run by hand, this may race it: wait.
attempt=1
until temporal operator namespace describe --namespace "$namespace" >/dev/null 2>&1; do
    if [ "$attempt" -ge "$attempts" ]; then
        echo "namespace $namespace not found at $TEMPORAL_ADDRESS after $attempts attempts" >&2
        exit 1
    fi
    echo "waiting for namespace $namespace at $TEMPORAL_ADDRESS ($attempt/$attempts)"
    attempt=$((attempt + 1))
    sleep 2
done

# Type names compare loosely: KeywordList, keyword_list and INDEXED_VALUE_TYPE_KEYWORD_LIST match.
normalise() {
    printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | sed -e 's/^indexed_value_type_//' -e 's/_//g'
}

# The type of attribute $1 on the namespace, or nothing if it is not registered.
registered_type() {
    temporal operator search-attribute list --namespace "$namespace" | awk -v name="$1" '$1 == name { print $2; exit }'
}

for pair in "$@"; do
    name="${pair%%=*}"
    type="${pair#*=}"
    if [ -z "$name" ] || [ "$name" = "$pair" ] || [ -z "$type" ]; then
        echo "not Name=Type: $pair" >&2
        exit 2
    fi
    existing="$(registered_type "$name")"
    if [ -z "$existing" ]; then
        if output="$(temporal operator search-attribute create --namespace "$namespace" --name "$name" --type "$type" 2>&1)"; then
            echo "registered $name ($type) on $namespace"
            continue
        fi
        # Another process (a worker starting at the same time) may have won the race.
        existing="$(registered_type "$name")"
        if [ -z "$existing" ]; then
            echo "$output" >&2
            echo "cannot register $name ($type) on $namespace" >&2
            exit 1
        fi
    fi
    if [ "$(normalise "$existing")" != "$(normalise "$type")" ]; then
        echo "$name already exists on $namespace as $existing, not $type" >&2
        exit 1
    fi
    echo "$name ($type) already exists on $namespace"
done
