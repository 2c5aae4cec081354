"""The packaged job's TOML configuration: read, check every key, fill embedded defaults, resolve a JobSpec.

Every mistake found here stops the job before Spark starts, with one line that names the key and
says how to fix it: unknown keys (with did-you-mean), wrong types (strict: `"false"` is not a
boolean), values out of range, keys that contradict each other, and the target's own options
(checked by building the target, without connecting). With no [target] and no [state], the job
writes to ClickHouse embedded through chdb and to a file state store under `data_dir`, creating the
tables from their schemas. The keys and their types are in config_schema.py.
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import tomllib

from .config_schema import JobConfig, State, Table
from .errors import ConfigurationError
from .intervals import parse_interval
from .job_spec import JobSpec
from .kafka_source import check_options, check_starting_offsets
from .state import REDIS_SCHEMES, STATE_URL_ENV, STORE_SCHEMES  # STATE_URL_ENV moved to state/__init__.py
from .state.redis_location import parse_redis_url, with_options
from .targets import DESCRIPTORS, REGISTRY, descriptor_for, embedded_target_url, is_path_url, target_from_url
from .targets.columns import ColumnRules

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB|k|m|g)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3,
               "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


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
    _check_keys(data, JobConfig, "")
    config = _decode(data)
    data_dir = (base_dir / (config.data_dir or f"data/{config.job_id}")).resolve()
    kafka = config.kafka
    kafka_options = check_options(msgspec.to_builtins(kafka.options))
    topics = kafka.topics
    choices = [key for key, given in (("kafka.topics", topics is not None), ("kafka.topic_pattern", kafka.topic_pattern is not None),
                                      *((f"kafka.options.{name}", True) for name in kafka_options
                                        if name in ("subscribePattern", "assign"))) if given]
    if not choices:
        raise ConfigurationError("missing key 'kafka.topics' (a list of topics), or instead 'kafka.topic_pattern' (a regex "
                                 "over topic names; or a subscribePattern or assign in kafka.options)")
    if len(choices) > 1:
        raise ConfigurationError(f"{' and '.join(choices)} both choose topics; keep one")
    if topics is not None and (not topics or not all(topics)):
        raise ConfigurationError("kafka.topics: give a non-empty list of topic names, e.g. topics = [\"events\"]")
    if kafka.topic_pattern is not None:
        _regex(kafka.topic_pattern, "kafka.topic_pattern")
        kafka_options["subscribePattern"] = kafka.topic_pattern
    bootstrap = ",".join(kafka.bootstrap_servers) if isinstance(kafka.bootstrap_servers, list) else kafka.bootstrap_servers
    if not bootstrap.strip() or (isinstance(kafka.bootstrap_servers, list) and not all(kafka.bootstrap_servers)):
        raise ConfigurationError("kafka.bootstrap_servers: give \"host:port[,host:port]\" or a list of \"host:port\"")
    portless = [server.strip() for server in bootstrap.split(",") if not _BROKER.fullmatch(server.strip())]
    if portless:
        raise ConfigurationError(f"kafka.bootstrap_servers: {portless[0]!r} is not host:port (Kafka needs the port, "
                                 "e.g. \"127.0.0.1:9092\")")

    tables = {name: _table_schema(name, table) for name, table in config.tables.items()}
    if not tables and config.routing.topic_table is None:
        raise ConfigurationError("tables: give at least one [tables.<name>] with its schema "
                                 "(only routing.topic_table takes tables from the target)")
    dead_letter_table = config.dead_letters.table if config.dead_letters else None
    if dead_letter_table in tables:
        raise ConfigurationError(f"dead_letters.table: {dead_letter_table!r} is also a data table in [tables]; "
                                 "give the dead letters a table of their own")
    routing = config.routing
    _check_routing(routing, topics, tables)

    target = config.target
    embedded = target.url is None
    target_url = target.url or embedded_target_url(str(data_dir))
    _check_url(target_url, tuple(REGISTRY), "target.url")
    state_url = config.state.url or f"file://{data_dir / 'state'}"
    _check_url(state_url, STORE_SCHEMES, "state.url")
    state_url = _state_url(os.environ.get(STATE_URL_ENV, state_url), config.state)
    interval = config.trigger.interval
    interval_s = None if interval == "available-now" else parse_interval(interval, "trigger.interval")
    options = dict(target.options)
    descriptor = descriptor_for(target_url)
    _check_target(target_url, target.database, options)
    _check_timeouts(descriptor.trigger_timeouts, options, interval_s)
    _check_table_names(descriptor.columns, tables, routing, dead_letter_table)
    create_tables = embedded if target.create_tables is None else target.create_tables
    if create_tables and not descriptor.creates_tables:
        creators = " and ".join(d.display_name for d in DESCRIPTORS if d.creates_tables)
        raise ConfigurationError(f"target.create_tables: the sink creates tables only in {creators}; create them "
                                 f"in {descriptor.product} first and remove the key")

    sink = config.sink
    spec = JobSpec(
        job_id=config.job_id,
        bootstrap=bootstrap,
        topics=topics,
        kafka_options=kafka_options,
        target_url=target_url,
        database=target.database,
        state_url=state_url,
        checkpoint=_checkpoint(sink.checkpoint, base_dir, data_dir),
        tables=tables,
        table_selects={name: _table_select(name, table) for name, table in config.tables.items() if table.select is not None},
        source_format=kafka.format,
        table_keys={name: list(table.key) for name, table in config.tables.items() if table.key is not None} or None,
        table=routing.table,
        table_field=routing.field,
        topic_tables=routing.topics,
        topic_table=routing.topic_table,
        dead_letter_table=dead_letter_table,
        metadata_columns=_metadata_columns(sink.metadata_columns),
        on_unknown_field=sink.on_unknown_field,
        max_offsets_per_trigger=kafka.max_offsets_per_trigger,
        starting_offsets=check_starting_offsets(kafka.starting_offsets),
        trigger=interval if interval_s is None else f"{interval_s} seconds",
        flush_bytes=_size(sink.flush_bytes, "sink.flush_bytes"),
        accept_empty_state=sink.accept_empty_state,
        driver_fetch=sink.driver_fetch,
        transaction_share=sink.transaction_share,
        spread=sink.spread,
        spread_above=sink.spread_above,
        query_restarts=sink.query_restarts,
        target_options=options,
        create_tables=create_tables,
        metrics_port=sink.metrics_port,
        metrics_host=sink.metrics_host,
        spark_conf={k: _spark_value(v) for k, v in config.spark.conf.items()},
    )
    spec.validate()
    return spec


def _decode(data: dict[str, Any]) -> JobConfig:
    """Strict types, with the failing key named the way the file spells it."""
    try:
        return msgspec.convert(data, JobConfig, strict=True)
    except msgspec.ValidationError as error:
        text = str(error)
        match = re.match(r"^(.*?)(?: - at `\$(.*)`)?$", text)
        message, path = (match.group(1), match.group(2) or "") if match else (text, "")
        key = re.sub(r"\[(\d+|\.\.\.)\]", lambda m: f"[{m.group(1)}]" if m.group(1) != "..." else "", path).lstrip(".")
        missing = re.match(r"Object missing required field `(.+)`", message)
        if missing:
            where = _missing_path(data, path, missing.group(1)) or key
            raise ConfigurationError(f"missing key {'.'.join(filter(None, [where, missing.group(1)]))!r}") from None
        if key == "job_id" and "regex" in message:
            raise ConfigurationError(f"job_id: {data.get('job_id')!r} must be 1-64 letters, digits, '.', '_' or '-'") from None
        value = _value_at(data, key)
        if message.startswith("Invalid enum value"):
            allowed = _literal_values(JobConfig, key)
            raise ConfigurationError(f"{key} = {value!r}: not one of {', '.join(map(str, allowed))}") from None
        expected = re.sub(r"`([^`]*)`", r"\1", message).replace("Expected", "expected").replace(" | null", "")
        raise ConfigurationError(f"{key or 'the file'} = {value!r}: {expected}") from None


def _missing_path(data: Any, path: str, field: str) -> str | None:
    """The key of the section that lacks `field`, with the names msgspec leaves out (`[...]` stands for a table's
    name, as in `tables.<name>`): the first section on the path that lacks it."""
    def walk(node: Any, parts: list[str], names: list[str]) -> str | None:
        if not parts:
            return ".".join(names) if isinstance(node, dict) and field not in node else None
        head, rest = parts[0], parts[1:]
        if head == "[...]" and isinstance(node, dict):
            return next((found for name, child in node.items() if (found := walk(child, rest, [*names, _key(name)]))), None)
        if head.startswith("[") and isinstance(node, list):
            index = int(head[1:-1])
            return walk(node[index], rest, [*names[:-1], f"{names[-1]}[{index}]"]) if index < len(node) else None
        return walk(node.get(head), rest, [*names, head]) if isinstance(node, dict) else None

    if "[...]" not in path:
        return None
    return walk(data, re.findall(r"\[[^\]]*\]|[^.\[\]]+", path), [])


def _key(name: str) -> str:
    """A TOML key as a path names it: quoted when it holds a dot or a quote."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _value_at(data: Any, key: str) -> Any:
    for part in re.findall(r"[^.\[\]]+", key):
        data = data[int(part)] if isinstance(data, list) else data.get(part) if isinstance(data, dict) else None
    return data


def _literal_values(cls: Any, key: str) -> tuple[Any, ...]:
    """The allowed values of the Literal a key's type holds (searched through unions and lists)."""
    annotation: Any = cls
    for part in re.findall(r"[^.\[\]]+", key):
        struct = _struct_in(annotation)
        if struct is not None:
            annotation = {f.name: f.type for f in msgspec.structs.fields(struct)}.get(part, annotation)
    stack = [annotation]
    while stack:
        current = stack.pop()
        if typing.get_origin(current) is typing.Literal:
            return typing.get_args(current)
        stack.extend(typing.get_args(current))
    return ()


def _check_keys(data: Any, cls: type, prefix: str) -> None:
    """Unknown keys, named by their path, with a did-you-mean: before types, so a typo is called a typo."""
    if not isinstance(data, dict):
        return
    fields = {f.name: f.type for f in msgspec.structs.fields(cls)}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            hint = difflib.get_close_matches(key, sorted(fields), n=1)
            extra = ""
            if prefix == "kafka" and (key.startswith("kafka.") or key[:1].islower() and any(c.isupper() for c in key)):
                extra = "; Spark's Kafka source options go in [kafka.options]"
            raise ConfigurationError(
                f"unknown key {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else f"; known: {sorted(fields)}") + extra)
        kind = _struct_in(fields[key])
        if kind is not None:
            _check_keys(value, kind, name)
        elif key == "tables" and isinstance(value, dict):
            for table, spec in value.items():
                _check_keys(spec, Table, f"tables.{table}")


def _struct_in(annotation: Any) -> type | None:
    """The Struct type of a field (also inside `X | None`, not inside `dict[...]`), or None."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for candidate in (annotation, *(typing.get_args(annotation) if union else ())):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


#: One `bootstrap.servers` entry as Kafka's client reads it: [listener://]host:port, an IPv6 host in brackets.
_BROKER = re.compile(r"(?:[A-Za-z_]+://)?(?:\[[0-9A-Fa-f:.%]+\]|[^:/\s\[\]]+):(?:[1-9]\d{0,4})")


def _check_table_names(rules: ColumnRules, tables: dict[str, Any], routing: Any, dead_letter_table: str | None) -> None:
    """Every table name the file gives is one the target can hold (its descriptor's rule), naming the key."""
    named = [(f"tables.{name}", name) for name in tables]
    named += [("routing.table", routing.table)] if routing.table else []
    named += [(f"routing.topics.{topic}", table) for topic, table in (routing.topics or {}).items()]
    named += [("dead_letters.table", dead_letter_table)] if dead_letter_table else []
    for key, name in named:
        problem = rules.table_name_problem(name)
        if problem:
            raise ConfigurationError(f"{key}: {name!r}: {problem}")


def _check_routing(routing: Any, topics: list[str] | None, tables: dict[str, str]) -> None:
    given = [k for k in ("field", "topics", "table", "topic_table") if getattr(routing, k) is not None]
    if len(given) != 1:
        raise ConfigurationError(
            "routing: give exactly one of routing.field (a message field names the table), "
            "routing.topics (topic -> table), routing.table (every message to one table) or "
            "routing.topic_table (a regex whose first group over the topic is the table)"
            + (f"; the file gives {', '.join('routing.' + key for key in given)}" if given else "")
        )
    if routing.topic_table is not None and _regex(routing.topic_table, "routing.topic_table").groups < 1:
        raise ConfigurationError(f"routing.topic_table: {routing.topic_table!r} has no group; write the table's part "
                                 "of the topic in parentheses, e.g. \"^pg\\\\.public\\\\.(.+)$\"")
    if routing.field is not None and not routing.field.strip():
        raise ConfigurationError("routing.field: give the name of the message field that names the table")
    if routing.topics is not None:
        if topics is not None:
            unmapped = sorted(set(topics) - set(routing.topics))
            if unmapped:
                raise ConfigurationError(f"routing.topics: no table for topic(s) {unmapped}; map every topic in kafka.topics")
        unknown = sorted(set(routing.topics.values()) - set(tables))
        if unknown:
            raise ConfigurationError(f"routing.topics: table(s) {unknown} have no [tables.<name>] schema")
    if routing.table is not None and routing.table not in tables:
        hint = difflib.get_close_matches(routing.table, sorted(tables), n=1)
        raise ConfigurationError(f"routing.table: {routing.table!r} has no [tables.{routing.table}] schema"
                                 + (f" (did you mean {hint[0]!r}?)" if hint else ""))


def _regex(pattern: str, key: str) -> re.Pattern[str]:
    """A regex Python reads (the job routes by it in Spark, which reads Java's dialect: keep to their common part)."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ConfigurationError(f"{key}: {pattern!r} is not a regular expression: {error}") from None
    if not pattern.strip():
        raise ConfigurationError(f"{key}: give a regular expression, e.g. \"^pg\\\\.public\\\\..+$\"")
    return compiled


def _check_target(url: str, database: str, options: dict[str, Any]) -> None:
    """The target's own options, checked by building it (it connects only when the job starts)."""
    descriptor = descriptor_for(url)
    known = descriptor.option_names
    for key in options:
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigurationError(
                f"unknown key 'target.options.{key}' for {descriptor.product}"
                + (f" (did you mean {hint[0]!r}?)" if hint else f"; known: {sorted(known)}"))
    try:
        target_from_url(url, database, options)
    except ConfigurationError as error:
        raise ConfigurationError(f"target: {error}") from None
    except (TypeError, ValueError) as error:
        for key, value in options.items():  # name the option that fails on its own
            try:
                target_from_url(url, database, {key: value})
            except (TypeError, ValueError, ConfigurationError):
                raise ConfigurationError(f"target.options.{key} = {value!r}: {error}") from None
        raise ConfigurationError(f"target.options: {error}") from None


def _check_timeouts(timeouts: tuple[tuple[str, float], ...], options: dict[str, Any], interval_s: float | None) -> None:
    """A transaction lives about one trigger interval before its commit: shorter server timeouts lose it."""
    if interval_s is None:
        return
    for key, factor in timeouts:
        minimum = factor * interval_s
        if key in options and float(options[key]) < minimum:
            raise ConfigurationError(
                f"target.options.{key} = {options[key]} s is shorter than {minimum:g} s for a trigger interval of "
                f"{interval_s:g} s: transactions would expire before they are committed. Raise it (the server "
                "default is safest) or shorten trigger.interval"
            )


def _checkpoint(value: str | None, base_dir: Path, data_dir: Path) -> str:
    """A Hadoop filesystem URL (hdfs://, s3a://, ...) as given; a local path relative to the file."""
    if value is None:
        return str(data_dir / "checkpoint")
    if not value.strip():
        raise ConfigurationError("sink.checkpoint: give a path or a URL such as hdfs://namenode/checkpoints/job")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value) and not value.startswith("file://"):
        return value
    return str((base_dir / value.removeprefix("file://")).resolve())


def _size(value: int | str, key: str) -> int:
    """Bytes, or a size such as "64MiB" / "64m"; at least 1 KiB."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ConfigurationError(f"{key}: {value!r} is not a size; write e.g. 67108864, \"64MiB\" or \"512KiB\"")
        value = int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    if value < 1024:
        raise ConfigurationError(f"{key}: {value!r} is not a byte count of at least 1024")
    return value


def _metadata_columns(value: bool | Sequence[str]) -> list[str]:
    """`true` keeps the first default (partition and offset), `false` none, or the listed record fields."""
    if isinstance(value, bool):
        return ["partition", "offset"] if value else []
    if len(set(value)) != len(value):
        raise ConfigurationError(f"sink.metadata_columns = {value!r}: a field is listed twice")
    return list(value)


def _spark_value(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _table_schema(name: str, table: Table) -> str:
    if not table.schema.strip():
        raise ConfigurationError(
            f"tables.{name}.schema: give the JSON fields as Spark DDL, e.g. schema = \"id BIGINT NOT NULL, name STRING\"")
    return table.schema


def _table_select(name: str, table: Table) -> str:
    """The select list as given; Spark checks it when the job starts (projection.py)."""
    assert table.select is not None
    if not table.select.strip():
        raise ConfigurationError(
            f"tables.{name}.select: give the table's columns, e.g. select = \"id, upper(name) AS name\", or remove the key")
    return table.select


def _state_url(url: str, state: State) -> str:
    """The store URL with [state]'s Redis options in its query, checked as the store will read it."""
    options = {"wait_replicas": state.wait_replicas, "wait_timeout": state.wait_timeout}
    given = {name: value for name, value in options.items() if value is not None}
    if urlsplit(url).scheme not in REDIS_SCHEMES:
        if given:
            raise ConfigurationError(f"state.{min(given)}: only a Redis state store has replicas; remove the key")
        return url
    if "wait_timeout" in given:
        given["wait_timeout"] = f"{parse_interval(given['wait_timeout'], 'state.wait_timeout'):g}"
    try:
        url = with_options(url, {name: str(value) for name, value in given.items()})
        parse_redis_url(url)
    except ValueError as error:
        raise ConfigurationError(f"state.url: {error}") from None
    return url


def _check_url(url: str, schemes: tuple[str, ...], key: str) -> None:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme not in schemes:
        hints = [f"{d.display_name} takes {d.scheme_hints[parsed.scheme]}" for d in DESCRIPTORS if parsed.scheme in d.scheme_hints]
        hint = f" ({'; '.join(hints)})" if hints and key == "target.url" else ""
        raise ConfigurationError(f"{key}: {url!r} must start with one of {', '.join(s + '://' for s in schemes)}{hint}")
    if parsed.username or parsed.password:
        raise ConfigurationError(
            f"{key}: do not write credentials in the file; set STREAMING_SINK_TARGET_USER and STREAMING_SINK_TARGET_PASSWORD"
            if key == "target.url" else f"{key}: do not write credentials in the file; put the whole URL in {STATE_URL_ENV}"
        )
    if parsed.scheme == "file" or (key == "target.url" and is_path_url(parsed.scheme)):
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ConfigurationError(f"{key}: {url!r} needs an absolute path ({parsed.scheme}:///absolute/path)")
        needed = REGISTRY[parsed.scheme].module_needed(parsed.scheme) if key == "target.url" else None
        if needed is not None and importlib.util.find_spec(needed.module) is None:
            raise ConfigurationError(
                f"{key}: {url!r} is {needed.what}, which needs {needed.module}: "
                f"pip install 'streaming-sink[{needed.extra}]' (or give a server's URL)")
    elif not parsed.hostname:
        raise ConfigurationError(f"{key}: {url!r} names no host; write e.g. {parsed.scheme}://host:port")
