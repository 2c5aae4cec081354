"""The packaged job's TOML configuration: read, check every key, fill embedded defaults, resolve a JobSpec.

Every mistake found here stops the job before any data moves, with a message that names the key
and says how to fix it. With no [target] and no [state], the job writes to ClickHouse embedded
through chdb and to a file state store under `data_dir`, creating the tables from their schemas.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .job import JobSpec
from .kafka_source import METADATA_FIELDS, check_options, check_starting_offsets
from .targets import ConfigurationError

_KEYS: dict[str, set[str]] = {
    "": {"job_id", "data_dir", "kafka", "routing", "tables", "dead_letters", "target", "state", "trigger", "sink", "spark"},
    "kafka": {"bootstrap_servers", "topics", "starting_offsets", "max_offsets_per_trigger", "options"},
    "routing": {"field", "topics", "table"},
    "dead_letters": {"table"},
    "target": {"url", "database", "options", "create_tables"},
    "state": {"url"},
    "trigger": {"interval"},
    "sink": {"flush_bytes", "checkpoint", "metadata_columns", "metrics_port", "accept_empty_state"},
    "spark": {"conf"},
}
_TABLE_KEYS = {"schema"}
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?|d|days?)\s*$")
STATE_URL_ENV = "STREAMING_SINK_STATE_URL"  # overrides state.url, for a Redis URL that carries a password
_TARGET_SCHEMES = ("chdb", "clickhouse", "clickhouses", "http", "https", "starrocks", "doris")
_STATE_SCHEMES = ("file", "redis", "rediss")


def load_config(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"{path} is not valid TOML: {error}") from None
    return resolve_config(data, base_dir=path.resolve().parent)


def resolve_config(data: dict[str, Any], base_dir: Path) -> JobSpec:
    _check_keys(data)
    job_id = _required(data, "job_id", str)
    data_dir = (base_dir / data.get("data_dir", f"data/{job_id}")).resolve()
    kafka = data.get("kafka", {})
    if not isinstance(kafka.get("options", {}), dict):
        raise ConfigurationError("kafka.options must be a table of Spark Kafka source options, e.g. "
                                 "options = { \"kafka.security.protocol\" = \"SASL_SSL\" }")
    kafka_options = check_options(kafka.get("options", {}))
    subscription = [name for name in kafka_options if name in ("subscribePattern", "assign")]
    topics = kafka.get("topics")
    if topics is None and not subscription:
        raise ConfigurationError("missing key 'kafka.topics' (or a subscribePattern or assign in kafka.options)")
    if topics is not None and subscription:
        raise ConfigurationError(f"kafka.topics and kafka.options.{subscription[0]} both choose topics; keep one")
    if topics is not None and (not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics)):
        raise ConfigurationError("kafka.topics: give a non-empty list of topic names, e.g. topics = [\"events\"]")
    bootstrap = _required(kafka, "bootstrap_servers", (str, list), "kafka.bootstrap_servers")
    if isinstance(bootstrap, list):
        bootstrap = ",".join(bootstrap) if all(isinstance(b, str) and b for b in bootstrap) else ""
    if not bootstrap.strip():
        raise ConfigurationError("kafka.bootstrap_servers: give \"host:port[,host:port]\" or a list of \"host:port\"")

    tables = {name: _table_schema(name, spec) for name, spec in _required(data, "tables", dict).items()}
    routing = data.get("routing", {})
    if len(routing) != 1:
        raise ConfigurationError(
            "routing: give exactly one of routing.field (a message field names the table), "
            "routing.topics (topic -> table) or routing.table (every message to one table)"
        )
    topic_tables = routing.get("topics")
    if topic_tables is not None and topics is not None:
        unmapped = sorted(set(topics) - set(topic_tables))
        if unmapped:
            raise ConfigurationError(f"routing.topics: no table for topic(s) {unmapped}; map every topic in kafka.topics")
    if topic_tables is not None:
        unknown = sorted(set(topic_tables.values()) - set(tables))
        if unknown:
            raise ConfigurationError(f"routing.topics: table(s) {unknown} have no [tables.<name>] schema")
    if routing.get("table") is not None and routing["table"] not in tables:
        raise ConfigurationError(f"routing.table: {routing['table']!r} has no [tables.{routing['table']}] schema")

    target = data.get("target", {})
    embedded = "url" not in target
    target_url = target.get("url", f"chdb://{data_dir / 'clickhouse'}")
    _check_url(target_url, _TARGET_SCHEMES, "target.url")
    state_url = data.get("state", {}).get("url", f"file://{data_dir / 'state'}")
    _check_url(state_url, _STATE_SCHEMES, "state.url")
    state_url = os.environ.get(STATE_URL_ENV, state_url)
    interval = data.get("trigger", {}).get("interval", "available-now")
    interval_s = None if interval == "available-now" else parse_interval(interval, "trigger.interval")
    options = dict(target.get("options", {}))
    _check_timeouts(options, interval_s)

    sink = data.get("sink", {})
    flush_bytes = sink.get("flush_bytes", 64 * 1024 * 1024)
    if not isinstance(flush_bytes, int) or flush_bytes < 1024:
        raise ConfigurationError(f"sink.flush_bytes: {flush_bytes!r} is not a byte count of at least 1024")
    accept_empty_state = sink.get("accept_empty_state", False)
    if not isinstance(accept_empty_state, bool):
        raise ConfigurationError(f"sink.accept_empty_state: {accept_empty_state!r} must be true or false (unquoted)")
    max_offsets = kafka.get("max_offsets_per_trigger")
    if max_offsets is not None and (not isinstance(max_offsets, int) or max_offsets <= 0):
        raise ConfigurationError(f"kafka.max_offsets_per_trigger: {max_offsets!r} must be a positive integer")

    spec = JobSpec(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=topics,
        kafka_options=kafka_options,
        target_url=target_url,
        database=target.get("database", "default"),
        state_url=state_url,
        checkpoint=_checkpoint(sink.get("checkpoint"), base_dir, data_dir),
        tables=tables,
        table=routing.get("table"),
        table_field=routing.get("field"),
        topic_tables=topic_tables,
        dead_letter_table=data.get("dead_letters", {}).get("table"),
        metadata_columns=_metadata_columns(sink.get("metadata_columns", True)),
        max_offsets_per_trigger=max_offsets,
        starting_offsets=check_starting_offsets(kafka.get("starting_offsets", "earliest")),
        trigger=interval if interval_s is None else f"{interval_s} seconds",
        flush_bytes=flush_bytes,
        accept_empty_state=accept_empty_state,
        target_options=options,
        create_tables=bool(target.get("create_tables", embedded)),
        metrics_port=_port(sink.get("metrics_port"), "sink.metrics_port"),
        spark_conf={str(k): str(v) for k, v in data.get("spark", {}).get("conf", {}).items()},
    )
    spec.validate()
    return spec


def parse_interval(text: Any, key: str) -> float:
    match = _INTERVAL.match(str(text))
    if not match:
        raise ConfigurationError(f"{key}: {text!r} is not an interval; write e.g. \"10 seconds\", \"500 ms\" or \"2 minutes\"")
    unit = match.group(2)
    if unit == "ms" or unit.startswith("milli"):
        scale = 0.001
    else:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit[0]]
    return float(match.group(1)) * scale


def _check_timeouts(options: dict[str, Any], interval_s: float | None) -> None:
    """A transaction lives about one trigger interval before its commit: shorter server timeouts lose it."""
    if interval_s is None:
        return
    for key, minimum in (("timeout", interval_s), ("prepared_timeout", 2 * interval_s)):
        if key in options and float(options[key]) < minimum:
            raise ConfigurationError(
                f"target.options.{key} = {options[key]} s is shorter than {minimum:g} s for a trigger interval of "
                f"{interval_s:g} s: transactions would expire before they are committed. Raise it (the server "
                "default is safest) or shorten trigger.interval"
            )


def _check_keys(data: dict[str, Any]) -> None:
    for section, known in _KEYS.items():
        values = data if section == "" else data.get(section, {})
        if not isinstance(values, dict):
            raise ConfigurationError(f"[{section}] must be a table of keys, got {values!r}")
        for key in values:
            if key not in known:
                name = f"{section}.{key}" if section else key
                hint = difflib.get_close_matches(key, sorted(known), n=1)
                raise ConfigurationError(
                    f"unknown key {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else f"; known: {sorted(known)}")
                )
    for table, spec in data.get("tables", {}).items():
        for key in spec if isinstance(spec, dict) else []:
            if key not in _TABLE_KEYS:
                raise ConfigurationError(f"unknown key 'tables.{table}.{key}'; a table has only 'schema'")


def _checkpoint(value: Any, base_dir: Path, data_dir: Path) -> str:
    """A Hadoop filesystem URL (hdfs://, s3a://, ...) as given; a local path relative to the file."""
    if value is None:
        return str(data_dir / "checkpoint")
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"sink.checkpoint: {value!r} is not a path or a URL such as hdfs://namenode/checkpoints/job")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value) and not value.startswith("file://"):
        return value
    return str((base_dir / value.removeprefix("file://")).resolve())


def _metadata_columns(value: Any) -> list[str]:
    """`true` keeps the first default (partition and offset), `false` none, or a list of record fields."""
    if value is True:
        return ["partition", "offset"]
    if value is False:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(set(value)) != len(value):
        raise ConfigurationError(f"sink.metadata_columns: {value!r} must be true, false or a list of {list(METADATA_FIELDS)}")
    unknown = [v for v in value if v not in METADATA_FIELDS]
    if unknown:
        raise ConfigurationError(f"sink.metadata_columns: {unknown} are not Kafka record fields; choose from {list(METADATA_FIELDS)}")
    return [f for f in METADATA_FIELDS if f in value]


def _port(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigurationError(f"{key}: {value!r} is not a TCP port (0-65535; 0 picks a free one)")
    return value


def _table_schema(name: str, spec: Any) -> str:
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), str) or not spec["schema"].strip():
        raise ConfigurationError(f"tables.{name}.schema: give the JSON fields as Spark DDL, e.g. schema = \"id BIGINT NOT NULL, name STRING\"")
    return spec["schema"]


def _required(section: dict[str, Any], key: str, kind: type | tuple[type, ...], name: str | None = None) -> Any:
    name = name or key
    if key not in section:
        raise ConfigurationError(f"missing key {name!r}")
    if not isinstance(section[key], kind):
        expected = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise ConfigurationError(f"{name}: expected {expected}, got {section[key]!r}")
    return section[key]


def _check_url(url: Any, schemes: tuple[str, ...], key: str) -> None:
    parsed = urlparse(str(url))
    if parsed.scheme not in schemes:
        raise ConfigurationError(f"{key}: {url!r} must start with one of {', '.join(s + '://' for s in schemes)}")
    if parsed.username or parsed.password:
        raise ConfigurationError(
            f"{key}: do not write credentials in the file; set STREAMING_SINK_TARGET_USER and STREAMING_SINK_TARGET_PASSWORD"
            if key == "target.url" else f"{key}: do not write credentials in the file; put the whole URL in {STATE_URL_ENV}"
        )
    if parsed.scheme == "chdb" and importlib.util.find_spec("chdb") is None:
        raise ConfigurationError(
            f"{key}: {url!r} is ClickHouse embedded in the driver, which needs chdb: "
            "pip install 'streaming-sink[embedded]' (or give a server's URL)")
    if parsed.scheme in ("chdb", "file") and (parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")):
        raise ConfigurationError(f"{key}: {url!r} needs an absolute path ({parsed.scheme}:///absolute/path)")
