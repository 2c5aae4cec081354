"""Where a Redis state store lives, read from its URL: one server, a Sentinel-watched master, or a Cluster.

One parser for every entry point (`open_store`, `job.toml`, the CLI): it refuses a mistake in one line
before anything connects, and never shows the password (`redact_url`). The forms:

* `redis://[[user]:password@]host[:port][/db]`, `rediss://…` (TLS), `unix:///path.sock` — one server, or a
  managed service that fails over behind one address;
* `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/MASTER_NAME[/db]` — the master the Sentinels
  name, followed across failovers (the password is the data nodes'; Sentinels are reached without one);
* `redis+cluster://[[user]:password@]host[:port][,host[:port]…]` — Redis Cluster (database 0 only).

Options in the query string (`?name=value&…`):

* `wait_replicas` — after each journal write, wait until this many replicas have it (`auto`, the default: every
  replica the primary reports connected at that write, and never fewer than the store has seen; `0`: never wait);
* `wait_timeout` — seconds to wait for them (default 5); a write not replicated in time is a failed write;
* `failover_timeout` — seconds a call that failed the way a failover fails (connection lost or refused, no master,
  too few replicas) is tried again before it fails (default: with Sentinel, the Sentinels' own down-after-milliseconds
  plus twice the failover-timeout for the master; else 0, fail at once);
* TLS (`rediss://`): `ssl_ca_certs` (CA file), `ssl_certfile` + `ssl_keyfile` (client certificate),
  `ssl_cert_reqs` (`required`, the default, `optional`, `none`), `ssl_check_hostname` (`true`/`false`);
* `socket_timeout`, `socket_connect_timeout` (seconds), `password`.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from streaming_sink.errors import StateStoreAuthError, StateStoreError, StateStoreUnreachableError

#: The URL schemes of Redis stores.
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")

STORE_OPTIONS = ("wait_replicas", "wait_timeout", "failover_timeout")
_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CONNECTION_OPTIONS = (*_FILE_OPTIONS, "ssl_cert_reqs", "ssl_check_hostname", "socket_timeout",
                       "socket_connect_timeout", "password")
_DEFAULT_PORT = {"redis+sentinel": 26379, "redis+cluster": 6379}
_QUERY_SECRET = re.compile(r"(?i)((?:^|&)password=)[^&]*")

Kind = Literal["server", "sentinel", "cluster"]


def redact_url(url: str) -> str:
    """`redis://user:pw@host:port/db` as `redis://***@host:port/db` (and `?password=` as `***`): the form that
    may appear in output, errors and logs. A URL without credentials is returned unchanged."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = _QUERY_SECRET.sub(r"\1***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@dataclass(frozen=True)
class RedisLocation:
    """A parsed state-store URL. `url` still carries the password: keep it out of output (use `shown`)."""

    url: str
    kind: Kind
    nodes: tuple[tuple[str, int], ...] = ()  # Sentinels or Cluster seed nodes
    master: str = ""  # the Sentinel service name
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)  # connection options from the query
    wait_replicas: int | None = None  # None: "auto"
    wait_timeout: float = 5.0
    failover_timeout: float | None = None  # None: the Sentinels' own (RedisStateStore), 0 for a server or a Cluster

    @property
    def shown(self) -> str:
        return redact_url(self.url)


def parse_redis_url(url: str) -> RedisLocation:
    """The location a URL names; ValueError (one line, password hidden) for anything that would fail later."""
    shown = redact_url(url)
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"state store URL {shown!r}: scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - set(STORE_OPTIONS) - set(_CONNECTION_OPTIONS))
    if unknown:
        raise ValueError(f"state store URL {shown!r}: unknown option {unknown[0]!r}; known: "
                         f"{', '.join(STORE_OPTIONS + _CONNECTION_OPTIONS)}")
    for name in _FILE_OPTIONS:
        if name in query and not os.path.isfile(query[name]):
            raise ValueError(f"state store URL {shown!r}: {name} file {query[name]!r} does not exist")
    if set(query) & set(_FILE_OPTIONS) and parts.scheme != "rediss":
        raise ValueError(f"state store URL {shown!r}: TLS options need rediss://")
    if ("ssl_certfile" in query) != ("ssl_keyfile" in query):
        raise ValueError(f"state store URL {shown!r}: give ssl_certfile and ssl_keyfile together (client certificate)")
    wait_replicas = _wait_replicas(query.pop("wait_replicas", "auto"), shown)
    wait_timeout = _seconds(query.pop("wait_timeout", "5"), "wait_timeout", shown)
    failover = query.pop("failover_timeout", None)
    failover_timeout = None if failover is None else _seconds(failover, "failover_timeout", shown, zero=True)
    if failover_timeout is None and parts.scheme != "redis+sentinel":
        failover_timeout = 0.0
    common: dict[str, Any] = dict(options=query, wait_replicas=wait_replicas, wait_timeout=wait_timeout,
                                  failover_timeout=failover_timeout,
                                  username=unquote(parts.username) if parts.username else None,
                                  password=unquote(parts.password) if parts.password is not None else None)
    if parts.scheme not in _DEFAULT_PORT:
        return RedisLocation(url, "server", **common)
    nodes = _nodes(parts.netloc.rsplit("@", 1)[-1], _DEFAULT_PORT[parts.scheme], shown)
    path = [p for p in parts.path.split("/") if p]
    if parts.scheme == "redis+cluster":
        if path not in ([], ["0"]):
            raise ValueError(f"state store URL {shown!r}: Redis Cluster has database 0 only; drop {parts.path!r}")
        return RedisLocation(url, "cluster", nodes, **common)
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"state store URL {shown!r}: name the master, as in redis+sentinel://host:26379/mymaster/0")
    return RedisLocation(url, "sentinel", nodes, master=unquote(path[0]), db=int(path[1]) if len(path) == 2 else 0,
                         **common)


def with_options(url: str, options: dict[str, str]) -> str:
    """`url` with store options added to its query (job.toml's [state] keys); ValueError when it sets one already."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    clash = sorted(options.keys() & {name for name, _ in query})
    if clash:
        raise ValueError(f"{clash[0]} is set both in the state store URL and in [state]; keep one")
    return urlunsplit(parts._replace(query=urlencode([*query, *options.items()])))


@contextmanager
def translated_errors() -> Iterator[None]:
    """redis-py's errors raised as the sink's own (errors.py), at the store's edge: callers and the CLI see one tree."""
    try:
        yield
    except redis.AuthenticationError as error:
        raise StateStoreAuthError(str(error)) from error
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StateStoreUnreachableError(str(error).rstrip(".")) from error
    except redis.RedisError as error:
        raise StateStoreError(str(error)) from error


def connect(location: RedisLocation, socket_timeout: float) -> redis.Redis | RedisCluster:
    """A client that decodes replies to str; nothing is sent until the first command (but for a Cluster's map)."""
    with translated_errors():
        return _client(location, socket_timeout)


def _client(location: RedisLocation, socket_timeout: float) -> redis.Redis | RedisCluster:
    options: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout,
                               "decode_responses": True}
    if location.kind == "server":
        server_url = _without_store_options(location.url)
        return redis.Redis.from_url(server_url, **options)
    options.update(username=location.username, password=location.password)
    options.update(_typed(location.options))
    if location.kind == "cluster":
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in location.nodes], **options)
    sentinel_options = {"socket_timeout": options["socket_timeout"],
                        "socket_connect_timeout": options["socket_connect_timeout"]}
    sentinels = Sentinel(list(location.nodes), sentinel_kwargs=sentinel_options, **options)
    return cast("redis.Redis", sentinels.master_for(location.master, db=location.db))


def _without_store_options(url: str) -> str:
    """The URL as redis-py reads it: the store's own options removed (redis-py would refuse them)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in STORE_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _typed(options: dict[str, str]) -> dict[str, Any]:
    """Sentinel and Cluster query options with the types redis-py's constructors take (its URL parser does this
    for one server; TLS options are refused for them by `parse_redis_url`)."""
    typed: dict[str, Any] = dict(options)
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in typed:
            typed[name] = float(typed[name])
    if "ssl_check_hostname" in typed:
        typed["ssl_check_hostname"] = typed["ssl_check_hostname"].lower() in ("1", "true", "yes")
    return typed


def _wait_replicas(value: str, shown: str) -> int | None:
    if value == "auto":
        return None
    if not value.isdigit():
        raise ValueError(f"state store URL {shown!r}: wait_replicas must be 'auto' or a number of replicas, "
                         f"not {value!r}")
    return int(value)


def _seconds(value: str, name: str, shown: str, zero: bool = False) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 if zero else seconds > 0):
        raise ValueError(f"state store URL {shown!r}: {name} must be a number of seconds "
                         f"{'(0 or more)' if zero else 'above 0'}, not {value!r}")
    return seconds


def _nodes(netloc: str, default_port: int, shown: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"state store URL {shown!r}: give host:port[,host:port…], not {item!r}")
        nodes.append((host, int(port) if port else default_port))
    return tuple(nodes)
