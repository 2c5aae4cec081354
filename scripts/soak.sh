#!/usr/bin/env bash
# Soak test (not in CI): the packaged job on a Spark standalone cluster (two workers), Redis and the
# StarRocks emulator with faults; driver and executor SIGKILLs at seeded random instants; exact at the end.
# Defaults: 1,000,000 events, 50 kills. Example: scripts/soak.sh --events 20000 --kills 4 --seed 7
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export PYSPARK_PYTHON="$ROOT/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" scripts/soak.py "$@"
