#!/usr/bin/env bash
# The README's main-job command: set up everything, then run the kill -9 demo of the packaged job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # tests/support: test support, read from the repository, not installed
exec .venv/bin/python scripts/demo.py "$@"
