"""Every configuration mistake stops the job before data moves, with a message that names the key."""
from __future__ import annotations

import copy

import pytest

from streaming_sink.config import STATE_URL_ENV, load_config, resolve_config
from streaming_sink.intervals import parse_interval
from streaming_sink.targets.base import ConfigurationError

GOOD = {
    "job_id": "orders",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["events"], "max_offsets_per_trigger": 100},
    "routing": {"field": "table"},
    "tables": {"orders": {"schema": "id BIGINT NOT NULL, name STRING"}},
    "dead_letters": {"table": "dead_letters"},
    "trigger": {"interval": "10 seconds"},
}


def with_change(path: str, value, base=GOOD):
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    if value is KeyError:
        node.pop(last)
    else:
        node[last] = value
    return data


def test_embedded_defaults(tmp_path):
    spec = resolve_config(GOOD, tmp_path)
    assert spec.target_url == f"chdb://{tmp_path / 'data' / 'orders' / 'clickhouse'}"
    assert spec.state_url == f"file://{tmp_path / 'data' / 'orders' / 'state'}"
    assert spec.checkpoint == str(tmp_path / "data" / "orders" / "checkpoint")
    assert spec.create_tables and spec.table_field == "table" and spec.trigger == "10.0 seconds"
    assert spec.dead_letter_table == "dead_letters" and spec.tables == {"orders": "id BIGINT NOT NULL, name STRING"}


def test_a_real_target_does_not_create_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    spec = resolve_config(with_change("target", {"url": "starrocks://fe:8030", "database": "db"}), tmp_path)
    assert not spec.create_tables and spec.target_url == "starrocks://fe:8030"


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("kafka.topic", ["x"], "unknown key 'kafka.topic' (did you mean 'topics'?)"),
        ("tabels", {}, "unknown key 'tabels' (did you mean 'tables'?)"),
        ("tables.orders.shema", "x", "unknown key 'tables.orders.shema'"),
        ("job_id", KeyError, "missing key 'job_id'"),
        ("kafka.bootstrap_servers", KeyError, "missing key 'kafka.bootstrap_servers'"),
        ("kafka.topics", [], "kafka.topics: give a non-empty list"),
        ("kafka.max_offsets_per_trigger", 0, "kafka.max_offsets_per_trigger = 0: expected int >= 1"),
        ("tables.orders.schema", "", "tables.orders.schema: give the JSON fields as Spark DDL"),
        ("routing", {"field": "t", "table": "orders"}, "routing: give exactly one of routing.field"),
        ("routing", {"topics": {"other": "orders"}}, "routing.topics: no table for topic(s) ['events']"),
        ("routing", {"topics": {"events": "nope"}}, "routing.topics: table(s) ['nope'] have no [tables.<name>] schema"),
        ("routing", {"table": "nope"}, "routing.table: 'nope' has no [tables.nope] schema"),
        ("target.url", "mysql://h:9030", "target.url: 'mysql://h:9030' must start with one of chdb://"),
        ("target.url", "starrocks://root:secret@fe:8030", "target.url: do not write credentials in the file"),
        ("target.url", "chdb://relative/path", "target.url: 'chdb://relative/path' needs an absolute path"),
        ("state.url", "s3://bucket/state", "state.url: 's3://bucket/state' must start with one of file://"),
        ("state.url", "redis://:pw@h:6379/0", f"state.url: do not write credentials in the file; put the whole URL in {STATE_URL_ENV}"),
        ("state", {"wait_replicas": 1}, "state.wait_replicas: only a Redis state store has replicas; remove the key"),
        ("state", {"url": "redis://h/0?wait_replicas=1", "wait_replicas": 2},
         "state.url: wait_replicas is set both in the state store URL and in [state]; keep one"),
        ("state", {"url": "redis://h/0", "wait_timeout": "soon"}, "state.wait_timeout: 'soon' is not an interval"),
        ("state", {"url": "redis://h/0", "wait_replicas": -1}, "state.wait_replicas"),
        ("state.url", "redis+sentinel://s1:26379", "state.url: state store URL 'redis+sentinel://s1:26379': name the master"),
        ("state.url", "redis://h/0?ssl=true", "state.url: state store URL 'redis://h/0?ssl=true': unknown option 'ssl'"),
        ("trigger.interval", "often", "trigger.interval: 'often' is not an interval"),
        ("target", {"url": "starrocks://fe:8030", "options": {"timeout": 5}}, "target.options.timeout = 5 s is shorter than 10 s"),
        ("target", {"url": "starrocks://fe:8030", "options": {"prepared_timeout": 15}},
         "target.options.prepared_timeout = 15 s is shorter than 20 s"),
        ("target", {"url": "doris://fe:8030", "options": {"load_timeout_s": 5}},
         "target.options.load_timeout_s = 5 s is shorter than 10 s"),
        ("sink.flush_bytes", 10, "sink.flush_bytes: 10 is not a byte count"),
        ("sink.metrics_port", 70000, "sink.metrics_port = 70000: expected int <= 65535"),
        ("sink.driver_fetch", "all", "sink.driver_fetch = 'all': not one of stream, partitions"),
        ("sink.transaction_share", 0, "sink.transaction_share = 0: expected float > 0"),
        ("sink.transaction_share", 1.5, "sink.transaction_share = 1.5: expected float <= 1"),
        ("sink.spread", "sometimes", "sink.spread = 'sometimes': not one of auto, always, never"),
        ("sink.spread_above", 0, "sink.spread_above = 0: expected int >= 1"),
    ],
)
def test_configuration_errors_name_the_key(tmp_path, monkeypatch, path, value, message):
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    with pytest.raises(ConfigurationError) as error:
        resolve_config(with_change(path, value), tmp_path)
    assert message in str(error.value)


def test_driver_fetch_reaches_the_sink_s_runner(tmp_path):
    """Streaming by default; "partitions" bounds the driver's JVM to two partitions of a batch (execution.py)."""
    from streaming_sink.job import build_sink

    assert resolve_config(GOOD, tmp_path).driver_fetch == "stream"
    spec = resolve_config(with_change("sink.driver_fetch", "partitions"), tmp_path)
    assert build_sink(spec).runner.driver_fetch == "partitions"


def test_the_batch_budget_options_reach_the_sink_s_planner(tmp_path):
    from streaming_sink.job import build_sink

    spec = resolve_config(with_change("sink", {"transaction_share": 0.25, "spread": "never", "spread_above": 7}), tmp_path)
    planner = build_sink(spec).planner
    assert (planner.share, planner.spread, planner.spread_above) == (0.25, "never", 7)


def test_state_url_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_URL_ENV, "redis://:pw@h:6379/0")
    assert resolve_config(GOOD, tmp_path).state_url == "redis://:pw@h:6379/0"


def test_state_replication_keys_join_the_url_the_environment_gives_too(tmp_path, monkeypatch):
    """[state] wait_replicas / wait_timeout reach the store (and its Spark tasks) inside the one URL it reads."""
    config = with_change("state", {"url": "redis+sentinel://s1,s2/journal", "wait_replicas": 2, "wait_timeout": "1500 ms"})
    assert resolve_config(config, tmp_path).state_url == "redis+sentinel://s1,s2/journal?wait_replicas=2&wait_timeout=1.5"
    monkeypatch.setenv(STATE_URL_ENV, "redis://:pw@h:6379/0")
    assert resolve_config(config, tmp_path).state_url == "redis://:pw@h:6379/0?wait_replicas=2&wait_timeout=1.5"


def test_toml_file_errors(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("job_id = \n")
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        load_config(bad)


def test_intervals():
    assert parse_interval("500 ms", "k") == 0.5
    assert parse_interval("2 minutes", "k") == 120
    assert parse_interval("1h", "k") == 3600
    assert parse_interval("10 seconds", "k") == 10
    assert parse_interval("3 days", "k") == 3 * 86400


def test_the_embedded_clickhouse_without_its_extra_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "chdb" else real(name, *a))
    with pytest.raises(ConfigurationError, match=r"target.url: 'chdb://.*' is ClickHouse embedded in the driver, which "
                                                 r"needs chdb: pip install 'streaming-sink\[embedded\]'"):
        resolve_config(GOOD, tmp_path)
    assert resolve_config(with_change("target", {"url": "starrocks://fe:8030"}), tmp_path).target_url == "starrocks://fe:8030"


@pytest.mark.parametrize("value, expected", [
    ("hdfs://namenode:8020/checkpoints/orders", "hdfs://namenode:8020/checkpoints/orders"),
    ("s3a://bucket/checkpoints/orders", "s3a://bucket/checkpoints/orders"),
    ("ckpt", "{base}/ckpt"),
    ("file:///var/ckpt", "/var/ckpt"),
])
def test_a_checkpoint_on_a_cluster_filesystem_is_kept_as_a_url(tmp_path, value, expected):
    spec = resolve_config(with_change("sink.checkpoint", value), tmp_path)
    assert spec.checkpoint == expected.format(base=tmp_path)
