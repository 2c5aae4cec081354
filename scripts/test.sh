#!/usr/bin/env bash
# The project's test command: set up (idempotent, fast when done), then run pytest with any
# arguments given, e.g. `scripts/test.sh -m "not slow"` for the fast loop.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --tests

export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
