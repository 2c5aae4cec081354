"""The 40 broken configurations of the ecosystem review (trials 01-40), and the 36 mistakes of its 2026-11-24 sequel,
each held to one line that names the key, or to acceptance with the meaning the user wrote. The base is
examples/job.toml, as in the review."""
from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib

from streaming_sink.config import load_config, resolve_config
from streaming_sink.job_spec import JobSpec
from streaming_sink.targets.base import ConfigurationError

BASE = tomllib.loads((Path(__file__).resolve().parents[2] / "examples" / "job.toml").read_text())
DROP = object()


def changed(*changes: tuple[str, Any]) -> dict[str, Any]:
    """BASE with each dotted path set (or dropped); a quoted segment keeps its dots: kafka."kafka.x"."""
    data = copy.deepcopy(BASE)
    for path, value in changes:
        head, _, quoted = path.partition('."')
        *parents, last = head.split(".") + ([quoted.rstrip('"')] if quoted else [])
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DROP:
            node.pop(last)
        else:
            node[last] = copy.deepcopy(value)  # a shared value (STARROCKS) must not carry one trial's changes to the next
    return data


STARROCKS = ("target", {"url": "starrocks://fe-host:8030", "database": "analytics"})
TEN_MINUTES = ("trigger.interval", "10 minutes")

# (trial, changes, the one-line error it must give, or a check of what an accepted file means)
TRIALS: list[tuple[str, tuple, str | Callable[[JobSpec], bool]]] = [
    ("01", (("kafka.bootstrap_server", "h:9092"),), "unknown key 'kafka.bootstrap_server' (did you mean 'bootstrap_servers'?)"),
    ("02", (("kafka_options", {}),), "unknown key 'kafka_options'"),
    ("03", (('kafka."kafka.security.protocol"', "SASL_SSL"),),
     "unknown key 'kafka.kafka.security.protocol'; known: ['bootstrap_servers', 'format', 'max_offsets_per_trigger', 'options', "
     "'starting_offsets', 'topic_pattern', 'topics']; Spark's Kafka source options go in [kafka.options]"),
    ("04", (("kafka.topics", "events"),), "kafka.topics = 'events': expected array, got str"),
    ("05", (("kafka.max_offsets_per_trigger", "1000"),), "kafka.max_offsets_per_trigger = '1000': expected int, got str"),
    ("06", (("kafka.bootstrap_servers", ["b1:9092", "b2:9092"]),), lambda s: s.bootstrap == "b1:9092,b2:9092"),
    ("07", (("target", {"url": "starrocks:/fe-host:8030"}),), "target.url: 'starrocks:/fe-host:8030' names no host"),
    ("08", (("target", {"url": "mysql://fe-host:9030"}),), "StarRocks takes the FE's HTTP port, e.g. starrocks://fe-host:8030; Doris"),
    ("09", (("target", {"url": "starrocks://"}),), "target.url: 'starrocks://' names no host"),
    ("10", (("target", {"url": "clickhouse://ingest:s3cret@ch-host:8123"}),), "target.url: do not write credentials in the file"),
    ("11", (("state", {"url": "redis://:s3cret@redis-host:6379/0"}),), "state.url: do not write credentials in the file"),
    ("12", (("sink.flush_bytes", -1),), "sink.flush_bytes: -1 is not a byte count of at least 1024"),
    ("13", (("sink.flush_bytes", "64MiB"),), lambda s: s.flush_bytes == 64 * 1024 * 1024),
    ("14", (("kafka.max_offsets_per_trigger", -5),), "kafka.max_offsets_per_trigger = -5: expected int >= 1"),
    ("15", (("routing", {"table": "ordrs"}),), "routing.table: 'ordrs' has no [tables.ordrs] schema (did you mean 'orders'?)"),
    ("16", (("routing", {"topics": {"events": "refunds"}}),), "routing.topics: table(s) ['refunds'] have no [tables.<name>] schema"),
    ("17", (("routing", {"field": "table", "table": "orders"}),), "routing: give exactly one of routing.field"),
    ("18", (("job_id", DROP),), "missing key 'job_id'"),
    ("19", (("job_id", "orders ingest"),), "job_id: 'orders ingest' must be 1-64 letters, digits, '.', '_' or '-'"),
    ("20", (("trigger.interval", "10 sec"),), lambda s: s.trigger == "10.0 seconds"),
    ("21", (("trigger.interval", "availableNow"),), 'to drain what is there and stop, write "available-now"'),
    ("22", (STARROCKS, TEN_MINUTES, ("target.options", {"timeout": 300})),
     "target.options.timeout = 300 s is shorter than 600 s for a trigger interval of 600 s"),
    ("23", (("target", {"url": "doris://fe-host:8030", "database": "analytics", "options": {"load_timeout_s": 300}}), TEN_MINUTES),
     "target.options.load_timeout_s = 300 s is shorter than 600 s"),
    ("24", (("kafka.starting_offsets", "earlist"),), "kafka.starting_offsets: 'earlist' is not valid JSON"),
    # a Spark DDL parser needs Spark's JVM: the schema is checked when Spark starts, naming the key (job.parse_ddl)
    ("25", (("tables.orders.schema", "id BIGNT NOT NULL, name STRING"),), lambda s: "BIGNT" in s.tables["orders"]),
    ("26", (("sink.metadata_columns", "false"),), "sink.metadata_columns = 'false': expected bool | array, got str"),
    ("27", (("target", {"url": "clickhouse://ch:8123", "create_tables": "false"}),),
     "target.create_tables = 'false': expected bool, got str"),
    ("28", (("sink.metrics_port", True),), "sink.metrics_port = True: expected int, got bool"),
    ("29", (("kafka.max_offsets_per_trigger", True),), "kafka.max_offsets_per_trigger = True: expected int, got bool"),
    ("30", (STARROCKS, ("target.options", {"timout": 600})), "unknown key 'target.options.timout' for starrocks (did you mean 'timeout'?)"),
    ("31", (("target", {"url": "doris://fe-host:8030", "options": {"timeout": 600}}),),
     "unknown key 'target.options.timeout' for doris"),
    ("32", (("dead_letters.table", "orders"),), "dead_letters.table: 'orders' is also a data table in [tables]"),
    ("34", (("tables.orders.order_by", "id"),), "unknown key 'tables.orders.order_by'; known: ['key', 'schema', 'select']"),
    ("35", (("target", {"url": "clickhouse://ch:8123", "database": 5}),), "target.database = 5: expected str, got int"),
    ("36", (STARROCKS, ("target.options", {"timeout": "ten minutes"})), "target.options.timeout = 'ten minutes': invalid literal"),
    ("37", (("target", {"url": "clickhouse://ch:8123", "options": {"timeout": 600}}),),
     "unknown key 'target.options.timeout' for clickhouse (did you mean 'read_timeout_s'?)"),
    ("38", (("routing", {"field": 7}),), "routing.field = 7: expected str, got int"),
    ("39", (("state", {"url": "file://state"}),), "state.url: 'file://state' needs an absolute path"),
    ("40", (("tables", {}),), "tables: give at least one [tables.<name>] with its schema"),
]


# The ecosystem review of 2026-11-24 (its section 2) tried 36 mistakes through `run --config`. Those
# no trial above holds are cases R<n> (n: the review's number); a case the configuration layer does not yet turn into
# one line is a strict xfail naming the fix it needs (config.py), so the fix turns it into a pass.
REVIEW_TRIALS: list = [
    ("R05", (("tables.payments", {}),), "missing key 'tables.payments.schema'"),
    ("R11", (("routing", {"topics": {"events": "orders"}}), ("kafka.topics", ["events", "shop.payment"])),
     "routing.topics: no table for topic(s) ['shop.payment']; map every topic in kafka.topics"),
    ("R16", (("tables", {"shop.orders": {"schema": "id BIGINT"}}), ("routing", {"table": "shop.orders"})),
     lambda s: list(s.tables) == ["shop.orders"]),  # ClickHouse quotes it: `shop.orders`
    ("R17", (("tables", {"ord`ers": {"schema": "id BIGINT"}}), ("routing", {"table": "ord`ers"})),
     lambda s: list(s.tables) == ["ord`ers"]),
    ("R18", (("tables", {"o'rders": {"schema": "id BIGINT"}}), ("routing", {"table": "o'rders"})),
     lambda s: list(s.tables) == ["o'rders"]),
    ("R19", (('kafka.options."kafka.sasl.jaas.config"', {"env": "KAFKA_JAAS_NOT_SET"}),),
     "kafka.options.\"kafka.sasl.jaas.config\": environment variable 'KAFKA_JAAS_NOT_SET' is not set"),
    ("R28", (("sink.flush_bytes", "64 MB"),), lambda s: s.flush_bytes == 64_000_000),  # MB: 10^6, MiB: 2^20
    ("R29", (("routing", {"field": "table", "topics": {"events": "orders"}}),), "routing: give exactly one of routing.field"),
    ("R10", (("kafka.bootstrap_servers", "127.0.0.1"),), "kafka.bootstrap_servers: '127.0.0.1' is not host:port"),
    ("R16-starrocks", (STARROCKS, ("tables", {"shop.orders": {"schema": "id BIGINT"}}), ("routing", {"table": "shop.orders"})),
     "tables.shop.orders: 'shop.orders': StarRocks table names hold letters, digits and '_' only, not '.'"),
]
# Review number -> what holds it: a trial or case id of this file, or the test (path::name) where only a running Spark,
# broker or server can tell; None: held nowhere yet (a runtime message in Kafka's own words).
REVIEW_2026_11_24: dict[int, str | None] = {
    1: "01", 2: "tests/integration/test_first_hour.py::test_a_misspelt_kafka_consumer_setting_is_refused_with_the_right_name",
    3: "05", 4: "26", 5: "R05", 6: "16", 7: "tests/integration/test_dead_letters.py::test_a_schema_spark_cannot_parse_names_its_key",
    8: "tests/integration/test_kafka_probe.py::test_probe_names_missing_topics_and_unreachable_brokers",
    9: None,  # no DNS: Kafka's ConfigException, named with the brokers by the probe
    10: "R10", 11: "R11", 12: "tests/integration/test_first_hour.py::test_run_with_clickhouse_unreachable_is_one_line",
    13: "test_a_starrocks_or_doris_target_without_a_user_is_refused_not_root",
    14: "tests/integration/test_http.py::test_401_is_an_authentication_error_that_names_the_user",
    15: "tests/integration/test_first_hour.py::test_run_with_a_wrong_redis_password_is_one_line",
    16: "R16", 17: "R17", 18: "R18", 19: "R19",
    20: "tests/unit/test_kafka_source.py::test_a_sasl_login_without_its_jaas_entry_names_the_job_s_key",
    21: "test_a_starrocks_or_doris_target_without_a_user_is_refused_not_root", 22: "24", 23: "21", 24: "32", 25: "37",
    26: "36", 27: "09", 28: "R28", 29: "R29", 30: "19", 31: "28", 32: "27", 33: "38", 34: "23", 35: "40", 36: "39",
}


def trial_id(trial: Any) -> str:
    return str(getattr(trial, "id", None) or trial[0])  # a pytest.param (an xfail) carries its id


def test_every_mistake_of_the_review_is_held_somewhere():
    ids = {trial_id(t) for t in TRIALS + REVIEW_TRIALS}
    assert sorted(REVIEW_2026_11_24) == list(range(1, 37))
    repo = Path(__file__).resolve().parents[2]
    for number, held in REVIEW_2026_11_24.items():
        if held is None or held in ids:
            continue
        path, _, name = held.rpartition("::")
        source = (repo / path).read_text() if path else Path(__file__).read_text()
        assert f"def {name}(" in source, f"review mistake {number}: {held} does not exist"
    assert {h for h in REVIEW_2026_11_24.values() if h and h.startswith("R")} <= ids


@pytest.mark.parametrize("trial, changes, outcome", TRIALS + REVIEW_TRIALS,
                         ids=[trial_id(t) for t in TRIALS + REVIEW_TRIALS])
def test_review_trial(tmp_path, monkeypatch, trial, changes, outcome):
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    data = changed(*changes)
    if callable(outcome):
        assert outcome(resolve_config(data, tmp_path)), f"trial {trial}: accepted with another meaning"
        return
    with pytest.raises(ConfigurationError) as error:
        resolve_config(data, tmp_path)
    assert outcome in str(error.value) and "\n" not in str(error.value), f"trial {trial}: {error.value}"


def test_trial_33_toml_syntax(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('job_id = "x"\n[kafka]\ntopics = ["events"\n')
    with pytest.raises(ConfigurationError, match=r"is not valid TOML: Unclosed array"):
        load_config(path)


def test_a_starrocks_or_doris_target_without_a_user_is_refused_not_root(tmp_path, monkeypatch):
    monkeypatch.delenv("STREAMING_SINK_TARGET_USER", raising=False)
    for url in ("starrocks://fe-host:8030", "doris://fe-host:8030"):
        with pytest.raises(ConfigurationError, match="needs a user: set STREAMING_SINK_TARGET_USER"):
            resolve_config(changed(("target", {"url": url})), tmp_path)


def test_create_tables_only_where_the_sink_can_create_them(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    with pytest.raises(ConfigurationError, match="target.create_tables: the sink creates tables only in ClickHouse"):
        resolve_config(changed(("target", {"url": "starrocks://fe-host:8030", "create_tables": True})), tmp_path)
    assert not resolve_config(changed(("target", {"url": "clickhouse://ch:8123", "create_tables": False})), tmp_path).create_tables


@pytest.mark.parametrize("url", ["starrocks://fe-host:8030", "doris://fe-host:8030"])
def test_one_option_vocabulary_for_starrocks_and_doris(tmp_path, monkeypatch, url):
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    common = {"properties": {"where": "id > 0"}, "load_timeout_s": 900, "connect_timeout_s": 5,
              "read_timeout_s": 60, "retries": 2, "chunk_bytes": 1 << 20, "backoff_s": 0.1, "commit_parallelism": 4}
    spec = resolve_config(changed(("target", {"url": url, "options": common}), TEN_MINUTES), tmp_path)
    from streaming_sink.targets import target_from_url

    options = target_from_url(spec.target_url, spec.database, spec.target_options).options
    own = ({"properties": "properties", "timeout": "load_timeout_s", "connect_timeout": "connect_timeout_s",
            "read_timeout": "read_timeout_s", "http_retries": "retries", "load_chunk_bytes": "chunk_bytes"}
           if url.startswith("starrocks") else
           {"headers": "properties", "load_timeout_s": "load_timeout_s", "connect_timeout_s": "connect_timeout_s",
            "request_timeout_s": "read_timeout_s", "retries": "retries", "piece_bytes": "chunk_bytes"})
    for field, key in own.items():
        value = getattr(options, field)
        assert value == (tuple(common[key].items()) if key == "properties" else common[key]), field
    older = "read_timeout" if "starrocks" in url else "request_timeout_s"
    with pytest.raises(ConfigurationError, match="are the same option; give one"):
        resolve_config(changed(("target", {"url": url, "options": {"read_timeout_s": 5, older: 6}})), tmp_path)
    with pytest.raises(ConfigurationError, match="target.options.load_timeout_s = 300 s is shorter than 600 s"):
        resolve_config(changed(("target", {"url": url, "options": {"load_timeout_s": 300}}), TEN_MINUTES), tmp_path)


def test_the_target_registry_is_the_one_list_of_schemes_and_capabilities():
    from streaming_sink.job_spec import JobSpec
    from streaming_sink.targets import REGISTRY

    assert {descriptor.product for descriptor in REGISTRY.values()} == {"clickhouse", "starrocks", "doris"}
    assert sorted(s for s, d in REGISTRY.items() if d.creates_tables) == ["chdb", "clickhouse", "clickhouses", "http", "https"]
    spec = JobSpec(job_id="j", bootstrap="b:1", topics=["t"], target_url="doris://fe:8030", database="d",
                   state_url="file:///tmp/s", checkpoint="/tmp/c", tables={"t": "id INT"}, table="t", create_tables=True)
    with pytest.raises(ConfigurationError, match="create_tables: doris tables are never created by the sink"):
        spec.validate()
