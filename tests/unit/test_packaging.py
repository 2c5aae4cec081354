"""What the package installs into a user's environment: the sink, never the test support, and nothing
named `state` at the top level (the repository's state/ installs as streaming_sink.state)."""
from __future__ import annotations

import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

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

    # what a package index shows and a user's license scanner reads (issue 25): license, its text, classifiers, readme
    (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = email.parser.Parser().parsestr(zipfile.ZipFile(wheel).read(metadata_name).decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("licenses/LICENSE"))) == (ROOT / "LICENSE").read_bytes()
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.11" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the SPDX expression replaces them (PEP 639)
    assert metadata["Description-Content-Type"] == "text/markdown" and "# streaming-sink" in metadata.get_payload()
    assert metadata["Requires-Python"] == ">=3.10"


def test_the_license_is_the_apache_license_2_0() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202


def test_the_dependency_ranges_hold_what_ci_runs_and_refuse_what_the_job_refuses() -> None:
    """constraints.txt (what CI and the README install) lies in every range; pyspark's range leaves out exactly the
    releases whose Kafka source the job refuses (spark_session.KNOWN_BAD_KAFKA_SOURCE), and the Kafka source the job
    asks for is the installed pyspark's."""
    from packaging.requirements import Requirement

    from streaming_sink.spark_session import KNOWN_BAD_KAFKA_SOURCE, kafka_source_package

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = {Requirement(r).name: Requirement(r).specifier for r in project["dependencies"]}
    ranges.update({Requirement(r).name: Requirement(r).specifier for r in project["optional-dependencies"]["embedded"]})
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    for name, specifier in ranges.items():
        assert pins[name] in specifier, f"constraints.txt pins {name}=={pins[name]}, outside {specifier}"
    excluded = {spec.version for spec in ranges["pyspark"] if spec.operator == "!="}
    assert excluded == set(KNOWN_BAD_KAFKA_SOURCE)
    assert kafka_source_package(pins["pyspark"], "2.13") == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pins['pyspark']}"


def test_every_folder_of_the_package_is_in_the_wheel() -> None:
    """The package list is explicit (a package-dir mapping needs it): a new subpackage must be added to it."""
    packages = set(SETUPTOOLS["packages"])
    for package in packages:
        assert (folder_of(package) / "__init__.py").is_file(), package
        for child in folder_of(package).iterdir():
            if (child / "__init__.py").is_file():
                assert f"{package}.{child.name}" in packages, child
