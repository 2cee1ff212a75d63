#!/usr/bin/env bash
# `make demo`: the h2o example of InfluxDB 3's query plan documentation, end to end. Rerunnable: it starts from
# an empty `demo` database each time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "catalog (starts the project's local Postgres if needed)"
iox-batch catalog migrate
if iox-batch show --db demo >/dev/null 2>&1; then
    iox-batch drop --db demo --yes
fi

step "load examples/h2o.yaml: chunk C4 persisted as Parquet, chunk C5 still in the ingester"
iox-batch load examples/h2o.yaml --db demo

step "catalog state"
iox-batch show --db demo

QUERY="SELECT state, city, min_temp, max_temp, area, time FROM h2o ORDER BY state, city, time"
step "EXPLAIN $QUERY"
iox-batch explain --db demo "$QUERY"

step "the deduplicated rows (Spark, local): C5's SJ@600 replaces C4's, every other point stays"
iox-batch query --db demo "$QUERY"
