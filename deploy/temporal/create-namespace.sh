#!/bin/sh
# Creates the Temporal namespace onceflow runs in. One-shot and idempotent: a namespace that
# already exists is left as it is (its retention too). Runs in the temporalio/admin-tools image,
# which has the `temporal` CLI (docker-compose.yml's `create-namespace` job).
#
# Reads TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE, the same variables the worker reads, and
# NAMESPACE_RETENTION: how long closed runs stay visible (default 168h, a week).
set -eu

TEMPORAL_ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"
namespace="${TEMPORAL_NAMESPACE:-default}"
retention="${NAMESPACE_RETENTION:-168h}"
attempts="${CREATE_NAMESPACE_ATTEMPTS:-60}"
export TEMPORAL_ADDRESS

# The server's port opens before all of its services have joined: wait until it says it is healthy.
attempt=1
until temporal operator cluster health >/dev/null 2>&1; do
    if [ "$attempt" -ge "$attempts" ]; then
        echo "Temporal at $TEMPORAL_ADDRESS is not healthy after $attempts attempts" >&2
        exit 1
    fi
    echo "waiting for Temporal at $TEMPORAL_ADDRESS ($attempt/$attempts)"
    attempt=$((attempt + 1))
    sleep 2
done

if temporal operator namespace describe --namespace "$namespace" >/dev/null 2>&1; then
    echo "namespace $namespace already exists"
    exit 0
fi
if output="$(temporal operator namespace create --namespace "$namespace" --retention "$retention" 2>&1)"; then
    echo "created namespace $namespace (closed runs kept $retention)"
    exit 0
fi
# Another job may have created it meanwhile.
if temporal operator namespace describe --namespace "$namespace" >/dev/null 2>&1; then
    echo "namespace $namespace already exists"
    exit 0
fi
echo "$output" >&2
echo "cannot create namespace $namespace at $TEMPORAL_ADDRESS" >&2
exit 1
