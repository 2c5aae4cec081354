"""Every form of Redis state-store URL is read the same way everywhere, and a mistake is one line before connecting."""
from __future__ import annotations

import pytest

from streaming_sink.state.redis_location import parse_redis_url, redact_url, with_options


def test_one_server_with_its_options():
    location = parse_redis_url("redis://:pw@h:6380/2?wait_replicas=1&wait_timeout=2.5&socket_timeout=3")
    assert (location.kind, location.wait_replicas, location.wait_timeout) == ("server", 1, 2.5)
    assert location.options == {"socket_timeout": "3"} and location.shown == "redis://***@h:6380/2?wait_replicas=1&" \
        "wait_timeout=2.5&socket_timeout=3"
    assert parse_redis_url("redis://h").wait_replicas is None  # auto
    assert parse_redis_url("unix:///run/redis.sock").kind == "server"


def test_sentinel_nodes_master_and_database():
    location = parse_redis_url("redis+sentinel://user:pw@s1:26380,s2,[::1]:26381/journal/3")
    assert location.kind == "sentinel" and location.master == "journal" and location.db == 3
    assert location.nodes == (("s1", 26380), ("s2", 26379), ("[::1]", 26381))
    assert (location.username, location.password) == ("user", "pw")
    assert parse_redis_url("redis+sentinel://s1/journal").db == 0


def test_how_long_a_failover_is_ridden():
    """Sentinel: the Sentinels' own bound unless given (None: asked when first needed); elsewhere 0 unless given."""
    assert parse_redis_url("redis+sentinel://s1/journal").failover_timeout is None
    assert parse_redis_url("redis+sentinel://s1/journal?failover_timeout=45").failover_timeout == 45
    assert parse_redis_url("redis://h/0").failover_timeout == 0
    assert parse_redis_url("redis+cluster://n1:7000?failover_timeout=30").failover_timeout == 30
    location = parse_redis_url("redis://h/0?failover_timeout=0&socket_timeout=3")
    assert location.failover_timeout == 0 and location.options == {"socket_timeout": "3"}


def test_cluster_seed_nodes():
    location = parse_redis_url("redis+cluster://n1:7000,n2:7001")
    assert location.kind == "cluster" and location.nodes == (("n1", 7000), ("n2", 7001))


@pytest.mark.parametrize("url, says", [
    ("redis+sentinel://s1:26379", "name the master"),
    ("redis+sentinel://s1:26379/m/x", "name the master"),
    ("redis+cluster://n1:7000/2", "database 0 only"),
    ("redis+cluster://n1:port", "host:port"),
    ("redis://h/0?wait_replica=1", "unknown option 'wait_replica'"),
    ("redis://h/0?wait_replicas=all", "'auto' or a number"),
    ("redis://h/0?wait_timeout=0", "above 0"),
    ("redis://h/0?failover_timeout=-1", "failover_timeout must be a number of seconds \\(0 or more\\)"),
    ("rediss://h/0?ssl_ca_certs=/no/such/ca.pem", "does not exist"),
    ("redis://h/0?ssl_ca_certs=/etc/hostname", "need rediss://"),
    ("rediss://h/0?ssl_certfile=/etc/hostname", "together"),
    ("mysql://h/0", "scheme must be one of"),
])
def test_a_mistake_is_one_line_without_the_password(url, says):
    secret_url = url.replace("//", "//:Pw-0xSecret@", 1)
    with pytest.raises(ValueError, match=says) as caught:
        parse_redis_url(secret_url)
    assert "Pw-0xSecret" not in str(caught.value) and "\n" not in str(caught.value)


def test_options_from_the_job_file_join_the_url_once():
    assert with_options("redis://h/0?socket_timeout=3", {"wait_replicas": "2"}) == \
        "redis://h/0?socket_timeout=3&wait_replicas=2"
    with pytest.raises(ValueError, match="wait_replicas is set both"):
        with_options("redis://h/0?wait_replicas=1", {"wait_replicas": "2"})


def test_redaction():
    assert redact_url("redis+sentinel://u:pw@s1,s2/m") == "redis+sentinel://***@s1,s2/m"
    assert redact_url("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?password=***&db=1"
