"""The suite runs the type checker over the protocol modules ([tool.mypy] in pyproject.toml lists them),
so a type error in the commit protocol fails CI like a failing test."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing():
    # No incremental cache: a stale .mypy_cache must not hide an error, and the run leaves no files behind.
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
