"""What the package installs into a user's environment: the sink, never the test support, and nothing
named `state` at the top level (the repository's state/ installs as streaming_sink.state)."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def folder_of(package: str) -> Path:
    """Where setuptools reads a package from: its package-dir entry, else its dotted path."""
    mapped = SETUPTOOLS.get("package-dir", {})
    for prefix in sorted(mapped, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            return ROOT / mapped[prefix] / Path(*package[len(prefix):].split(".")[1:])
    return ROOT / Path(*package.split("."))


def test_the_wheel_holds_the_sink_and_not_the_test_support(tmp_path: Path) -> None:
    """Built for real (setuptools reads the package-dir mapping): every file lands under streaming_sink/."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    folders = {name.rpartition("/")[0] for name in names}
    assert {"streaming_sink", "streaming_sink/targets", "streaming_sink/state"} <= folders
    assert "streaming_sink/py.typed" in names  # type checkers read the package's hints (PEP 561)
    top_level = {folder.split("/")[0] for folder in folders}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"streaming_sink"}


def test_every_folder_of_the_package_is_in_the_wheel() -> None:
    """The package list is explicit (a package-dir mapping needs it): a new subpackage must be added to it."""
    packages = set(SETUPTOOLS["packages"])
    for package in packages:
        assert (folder_of(package) / "__init__.py").is_file(), package
        for child in folder_of(package).iterdir():
            if (child / "__init__.py").is_file():
                assert f"{package}.{child.name}" in packages, child
