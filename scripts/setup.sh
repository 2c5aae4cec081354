#!/usr/bin/env bash
# Idempotent set-up of a development/CI machine (Debian 12): system packages, the project's
# virtualenv, and the jars for the local Kafka broker and Spark's Kafka source. `--tests` adds what only the
# tests need: PostgreSQL and the Kafka Connect and Debezium jars of the change-data tests (scripts/test.sh asks).
# Every step checks before acting, so a second run takes seconds. Caches live outside the
# clone (~/.cache/pip, ~/.m2, ~/.cache/streaming-sink) so a fresh clone reuses them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
STAMP="$VENV/.streaming-sink-setup"
start=$SECONDS

log() { printf 'setup: %s\n' "$*" >&2; }

for_tests=0
for arg in "$@"; do
    case "$arg" in
        --tests) for_tests=1 ;;
        *) log "unknown argument $arg (only --tests)"; exit 2 ;;
    esac
done

# Python >= 3.10 with venv support: $PYTHON if given, else the first suitable on PATH.
pick_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3 python; do
        [[ -n "$candidate" ]] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys, ensurepip, venv; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
            2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

need_venv=0
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    need_venv=1
fi

# --- system packages ---------------------------------------------------------------------------
missing_pkgs=()
if ((need_venv)) && ! pick_python >/dev/null; then
    missing_pkgs+=(python3 python3-venv)  # Debian 12: Python 3.11; venv's ensurepip is separate
fi
command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]] || missing_pkgs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || [[ -x /usr/bin/redis-cli ]] || missing_pkgs+=(redis-tools)  # creates the test Cluster
command -v java >/dev/null 2>&1 || missing_pkgs+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing_pkgs+=(maven)
command -v setpriv >/dev/null 2>&1 || missing_pkgs+=(util-linux)
command -v openssl >/dev/null 2>&1 || missing_pkgs+=(openssl)  # test certificates (tests/integration/test_http.py)
# PostgreSQL for the change-data tests (tests/support/services/postgres.py): its binaries under
# /usr/lib/postgresql/<version>/bin, and the package's `postgres` account, which runs the server when we are root.
((for_tests)) && ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null && missing_pkgs+=(postgresql)
if ((${#missing_pkgs[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        SUDO=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        log "missing ${missing_pkgs[*]} and no root/sudo to install them; install them and re-run"
        exit 1
    fi
    log "installing ${missing_pkgs[*]} with apt-get"
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing_pkgs[@]}" >/dev/null
fi
# Debian starts a system-wide redis-server (and a PostgreSQL cluster on 5432) on install; tests start
# their own on free ports and do not need them (left alone: stopping system services is not this script's business).

# --- virtualenv --------------------------------------------------------------------------------
if ((need_venv)); then
    py="$(pick_python)" || { log "need Python >= 3.10 (set PYTHON=/path/to/python3)"; exit 1; }
    log "creating $VENV with $py ($("$py" --version 2>&1))"
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi

# Re-install only when the dependency declaration changed (the install is editable, so code
# edits never need it). The stamp is the hash of pyproject.toml and constraints.txt: the ranges
# users get, and the exact versions this machine is tested at.
if [[ -f pyproject.toml ]]; then
    want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
    have="$(cat "$STAMP" 2>/dev/null || true)"
    if [[ "$want" != "$have" ]] || ! "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("streaming-sink"); m.version("pytest")' 2>/dev/null; then
        log "pip install -e '.[embedded,test]' -c constraints.txt"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[embedded,test]'
        echo "$want" >"$STAMP"
    fi
else
    log "no pyproject.toml yet: using the venv as it is"
fi

# --- jars (Kafka broker and Connect, Debezium, Spark Kafka source) ---------------------------------------------------
# Run from the repo so `tests.support.services` is importable even before the editable install exists.
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m tests.support.services.jars \
    $( ((for_tests)) && echo --tests ) >/dev/null

log "ready in $((SECONDS - start))s"
