"""docker-compose.yml is valid Compose, healthy by construction, and runs the Kafka the tests run.

No Docker engine and no network: the file is checked against the Compose Specification JSON
Schema that the `check-jsonschema` package vendors (its builtin `vendor.compose-spec`), read
from the installed package, plus the project's own rules:

* every service has a healthcheck, so `docker compose up --wait` means "serving clients";
* the Kafka image tag is the broker version the tests run (`tests.support.services.jars.KAFKA_VERSION`);
* every `depends_on` names a service that exists and is started whenever the dependant is;
* no lone `$` (Compose would interpolate it away; shell and awk in healthchecks need `$$`);
* the published ports the README, the docs and the tests use stay where they are;
* tests/docker start the same StarRocks and Doris versions as this file by default.

`check-jsonschema` is a declared test dependency: without it these tests fail, saying so.
The `*_catches_*` tests break a copy of the file on purpose and assert each check notices.
"""
from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
KAFKA_VERSION_ENV = "STREAMING_SINK_KAFKA_VERSION"

#: Host ports that README.md, docs/local-stack.md and tests/docker rely on, per service.
EXPECTED_PORTS: dict[str, set[str]] = {
    "kafka": {"9092:9092"},
    "redis": {"6379:6379"},
    "clickhouse": {"8123:8123"},
    "starrocks": {"8030:8030", "8040:8040", "9030:9030"},
    "doris-fe": {"18030:8030", "19030:9030"},
    "doris-be": {"18040:8040"},
}

#: Default version in tests/support/real_cluster.py (what tests/docker start) -> the compose services whose image tag must carry it.
DOCKER_TEST_IMAGES: dict[str, tuple[str, str, dict[str, str]]] = {
    "starrocks": ("real_cluster.py", "STARROCKS_VERSION", {"starrocks": "starrocks/allin1-ubuntu:{}"}),
    "doris": ("real_cluster.py", "DORIS_VERSION",
              {"doris-fe": "apache/doris:fe-{}", "doris-be": "apache/doris:be-{}"}),
}

try:
    import jsonschema
    from ruamel.yaml import YAML

    _SCHEMA_TEXT = (
        importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    ).read_text(encoding="utf-8")
    _MISSING: str | None = None
except (ImportError, FileNotFoundError) as error:  # reported by every test below, never skipped
    _MISSING = (
        f"the Compose schema check needs the test dependency check-jsonschema ({type(error).__name__}: "
        f"{error}); install the test extra: .venv/bin/pip install -e '.[test]'"
    )


def _require_dependency() -> None:
    if _MISSING:
        pytest.fail(_MISSING, pytrace=False)


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as plain data (YAML 1.2, as Compose reads it)."""
    _require_dependency()
    data = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def schema_errors(document: dict[str, Any]) -> list[str]:
    """Every violation of the vendored Compose Specification schema, as 'path: message'."""
    _require_dependency()
    schema = json.loads(_SCHEMA_TEXT)
    validator_class = jsonschema.validators.validator_for(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{error.json_path}: {error.message}"
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


def healthcheck_problems(document: dict[str, Any]) -> list[str]:
    """Services that `docker compose up --wait` could not wait on (no usable healthcheck)."""
    problems = []
    for name, service in (document.get("services") or {}).items():
        check = (service or {}).get("healthcheck")
        if not check:
            problems.append(f"service {name!r} has no healthcheck")
            continue
        test = check.get("test")
        if check.get("disable") in (True, "true") or not test or test in ("NONE", ["NONE"]):
            problems.append(f"service {name!r} has its healthcheck disabled or empty: {check!r}")
        elif isinstance(test, list) and (test[0] not in ("CMD", "CMD-SHELL") or len(test) < 2):
            problems.append(f"service {name!r}: healthcheck test must start with CMD or CMD-SHELL and name a command")
    return problems


def kafka_tag_problems(document: dict[str, Any], version: str) -> list[str]:
    """The kafka service must run `apache/kafka:<version>`, the broker the tests run."""
    service = (document.get("services") or {}).get("kafka")
    if not service:
        return ["no service named 'kafka'"]
    image = str(service.get("image", ""))
    repository, _, tag = image.rpartition(":")
    if repository != "apache/kafka" or tag != version:
        return [f"kafka image is {image!r}; the tests run Kafka {version}: use 'apache/kafka:{version}' "
                "(or change tests/support/services/jars.py KAFKA_VERSION together with it)"]
    return []


def depends_on_problems(document: dict[str, Any]) -> list[str]:
    """Each `depends_on` names an existing service, started in every profile its dependant is."""
    services = document.get("services") or {}
    problems = []
    for name, service in services.items():
        depends = (service or {}).get("depends_on") or []
        for dependency in (depends if isinstance(depends, list) else list(depends)):
            if dependency not in services:
                problems.append(f"service {name!r} depends on {dependency!r}, which is not a service")
                continue
            own = set(service.get("profiles") or [])
            theirs = set((services[dependency] or {}).get("profiles") or [])
            if theirs and not (own and own <= theirs):
                problems.append(f"service {name!r} (profiles {sorted(own) or 'none'}) depends on {dependency!r}, "
                                f"which only starts with profiles {sorted(theirs)}")
            condition = depends[dependency].get("condition") if isinstance(depends, dict) else None
            if condition == "service_healthy" and not (services[dependency] or {}).get("healthcheck"):
                problems.append(f"service {name!r} waits for {dependency!r} to be healthy, which has no healthcheck")
    return problems


def interpolation_problems(text: str) -> list[str]:
    """Lines with a `$` that Compose would interpolate (only `$$`, a literal `$`, is used here)."""
    return [f"line {number}: lone '$' (write '$$' for a literal dollar): {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and "$" in line.replace("$$", "")]


def port_problems(document: dict[str, Any]) -> list[str]:
    """Published ports that moved away from what the README, docs and tests use."""
    services = document.get("services") or {}
    problems = []
    for name, expected in EXPECTED_PORTS.items():
        published = {str(port) for port in (services.get(name) or {}).get("ports") or []}
        if not expected <= published:
            problems.append(f"service {name!r} publishes {sorted(published)}; expected {sorted(expected)}")
    return problems


def docker_test_default_version(module: str, variable: str) -> str:
    """The default of `os.environ.get(variable, "<version>")` in tests/support/<module> (read, not imported)."""
    source = (ROOT / "tests" / "support" / module).read_text(encoding="utf-8")
    match = re.search(rf'os\.environ\.get\("{variable}", "([^"]+)"\)', source)
    assert match, f"tests/support/{module} no longer reads {variable} with a default version"
    return match.group(1)


def image_drift_problems(document: dict[str, Any], versions: dict[str, str]) -> list[str]:
    """Compose images that differ from what tests/docker start by default."""
    services = document.get("services") or {}
    problems = []
    for product, (module, variable, images) in DOCKER_TEST_IMAGES.items():
        for service, pattern in images.items():
            expected = pattern.format(versions[product])
            actual = (services.get(service) or {}).get("image")
            if actual != expected:
                problems.append(f"service {service!r} runs {actual!r} but tests/support/{module} starts {expected!r} "
                                f"({variable}); keep them equal")
    return problems


def docker_test_versions() -> dict[str, str]:
    """Default StarRocks and Doris versions of tests/docker, by product."""
    return {product: docker_test_default_version(module, variable)
            for product, (module, variable, _) in DOCKER_TEST_IMAGES.items()}


def expected_kafka_version() -> str:
    """tests.support.services.jars.KAFKA_VERSION as the tests use it by default (ignoring a local env override)."""
    if KAFKA_VERSION_ENV not in os.environ:
        from tests.support.services.jars import KAFKA_VERSION

        return KAFKA_VERSION
    env = {key: value for key, value in os.environ.items() if key != KAFKA_VERSION_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", "from tests.support.services.jars import KAFKA_VERSION; print(KAFKA_VERSION)"],
                            env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _fail_on(problems: list[str], what: str) -> None:
    if problems:
        pytest.fail(f"{COMPOSE_FILE.name}: {what}:\n  " + "\n  ".join(problems), pytrace=False)


# The file as committed.

def test_compose_file_matches_the_compose_specification_schema() -> None:
    _fail_on(schema_errors(load_compose()), "not valid against the Compose Specification schema")


def test_every_service_has_a_healthcheck() -> None:
    _fail_on(healthcheck_problems(load_compose()), "services without a usable healthcheck")


def test_kafka_image_is_the_broker_version_the_tests_run() -> None:
    _fail_on(kafka_tag_problems(load_compose(), expected_kafka_version()), "Kafka version drift")


def test_depends_on_names_existing_services() -> None:
    _fail_on(depends_on_problems(load_compose()), "bad depends_on")


def test_no_unescaped_dollar_signs() -> None:
    _require_dependency()
    _fail_on(interpolation_problems(COMPOSE_FILE.read_text(encoding="utf-8")), "Compose would interpolate these")


def test_published_ports_are_the_documented_ones() -> None:
    _fail_on(port_problems(load_compose()), "ports moved")


def test_docker_tests_start_the_same_starrocks_and_doris() -> None:
    _fail_on(image_drift_problems(load_compose(), docker_test_versions()), "image drift from tests/docker")


# The checks have teeth: each breakage of a copy is caught.

def _unknown_key(doc: dict[str, Any]) -> None:
    doc["services"]["kafka"]["helthcheck"] = doc["services"]["kafka"].pop("healthcheck")


def _bad_healthcheck_field(doc: dict[str, Any]) -> None:
    doc["services"]["redis"]["healthcheck"]["interval"] = 5  # must be a duration string


def _unknown_top_level_key(doc: dict[str, Any]) -> None:
    doc["service"] = doc.pop("services")


@pytest.mark.parametrize("breakage", [_unknown_key, _bad_healthcheck_field, _unknown_top_level_key])
def test_schema_check_catches(breakage: Callable[[dict[str, Any]], None]) -> None:
    document = copy.deepcopy(load_compose())
    breakage(document)
    assert schema_errors(document)


@pytest.mark.parametrize("service", ["kafka", "redis", "clickhouse", "starrocks", "doris-fe", "doris-be"])
def test_healthcheck_check_catches_a_service_without_one(service: str) -> None:
    document = copy.deepcopy(load_compose())
    del document["services"][service]["healthcheck"]
    assert healthcheck_problems(document) == [f"service {service!r} has no healthcheck"]
    document["services"][service]["healthcheck"] = {"test": ["NONE"]}
    assert healthcheck_problems(document)


@pytest.mark.parametrize("image", ["apache/kafka:3.9.1", "apache/kafka:latest", "bitnami/kafka:{v}", "apache/kafka"])
def test_kafka_check_catches_a_wrong_tag(image: str) -> None:
    document = copy.deepcopy(load_compose())
    version = expected_kafka_version()
    document["services"]["kafka"]["image"] = image.format(v=version)
    assert kafka_tag_problems(document, version)


def test_depends_on_check_catches_unknown_and_profile_only_services() -> None:
    document = copy.deepcopy(load_compose())
    document["services"]["doris-be"]["depends_on"] = {"doris-frontend": {"condition": "service_healthy"}}
    assert depends_on_problems(document) == ["service 'doris-be' depends on 'doris-frontend', which is not a service"]
    document["services"]["kafka"]["depends_on"] = ["starrocks"]  # kafka always starts, starrocks only with its profile
    assert any("'kafka'" in problem for problem in depends_on_problems(document))


def test_image_drift_check_catches_a_different_doris_tag() -> None:
    document = copy.deepcopy(load_compose())
    document["services"]["doris-be"]["image"] = "apache/doris:be-2.1.8"
    assert [problem for problem in image_drift_problems(document, docker_test_versions()) if "doris-be" in problem]


def test_interpolation_check_catches_a_lone_dollar() -> None:
    _require_dependency()
    text = COMPOSE_FILE.read_text(encoding="utf-8").replace("$$i", "$i", 1)
    assert interpolation_problems(text)
