"""What the package installs into a user's environment: the sink, never the test support."""
from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_sink_and_not_the_test_support() -> None:
    found = (tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"])
    packages = set(find_packages(str(ROOT), include=found["include"]))
    assert {"streaming_sink", "streaming_sink.targets", "state"} <= packages
    assert not {name for name in packages if name.split(".")[0] in ("devstack", "tests", "bench", "scripts")}
