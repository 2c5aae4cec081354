"""The published JSON Schema of job.toml is the one the loader's types make, and it accepts the example."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import tomllib

from streaming_sink.config_schema import SCHEMA_PATH, json_schema

ROOT = Path(__file__).resolve().parents[2]


def test_the_published_schema_is_current():
    assert json.loads(SCHEMA_PATH.read_text()) == json_schema(), (
        "docs/job.schema.json is stale: run `python -m streaming_sink.config_schema`")


def test_the_schema_accepts_the_example_and_refuses_what_the_loader_refuses():
    validator = jsonschema.Draft202012Validator(json_schema())
    example = tomllib.loads((ROOT / "examples" / "job.toml").read_text())
    assert list(validator.iter_errors(example)) == []
    broken = dict(example, sink={"metrics_port": True, "metadata_columns": "false"}, tabels={})
    messages = sorted(e.message for e in validator.iter_errors(broken))
    assert any("'tabels' was unexpected" in m for m in messages), messages
    assert any("True is not of type 'integer'" in m or "True is not valid" in m for m in messages), messages
    assert "#:schema ../docs/job.schema.json" in (ROOT / "examples" / "job.toml").read_text()
