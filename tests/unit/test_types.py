"""The suite runs the type checker over every module ([tool.mypy] in pyproject.toml),
so a type error in the commit protocol fails CI like a failing test."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    # mypy cannot follow the package-dir mapping (state/ installs as streaming_sink/state/), so it reads a
    # copy laid out as the wheel installs it. No incremental cache: a stale one must not hide an error.
    shutil.copytree(ROOT / "streaming_sink", tmp_path / "streaming_sink", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "state", tmp_path / "streaming_sink" / "state", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--no-incremental", "--cache-dir", "/dev/null"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
