#!/usr/bin/env bash
# The benchmark: every mode side by side on one Kafka topic in one run (bench/README.md).
# Sets up like scripts/test.sh (scripts/setup.sh, then the `bench` extra: matplotlib for the plot),
# then `python -m bench` with any options given: --quick (under 3 minutes), or the full size by default
# (under 12 minutes on 2 cores); --events N --batches B for other sizes; --help for the rest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
if ! "$ROOT/.venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    echo "bench: pip install -e '.[embedded,test,bench]' -c constraints.txt" >&2
    "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[embedded,test,bench]'
fi

export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" -m bench "$@"
