"""Targets: databases that take part in the sink's two-phase commit, and the one registry of how a URL
names one and what each can do. Config, job, doctor and CLI ask the registry; adding a target means
its module, its emulator or fixture, and an entry in `REGISTRY`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from urllib.parse import urlparse, urlunparse

from .base import CommitOutcome, ConfigurationError, Target, TargetError
from .clickhouse import ClickHouseTarget

__all__ = ["REGISTRY", "ClickHouseTarget", "CommitOutcome", "ConfigurationError", "Target", "TargetError",
           "TargetKind", "target_from_url", "target_kind", "target_option_names"]

USER_ENV = "STREAMING_SINK_TARGET_USER"
PASSWORD_ENV = "STREAMING_SINK_TARGET_PASSWORD"


@dataclass(frozen=True)
class TargetKind:
    """What one URL scheme names: the class, how it is reached, and what the target can do."""

    product: str  # clickhouse | starrocks | doris: the `kind` its transactions record in the journal
    module: str
    class_name: str
    transport: str  # the scheme of the URL the class takes: chdb | http | https
    creates_tables: bool  # `target.create_tables` can create missing tables from the job's schemas
    needs_user: bool  # a user is required (no silent default login)
    #: options that must outlast the trigger interval, with the factor: a transaction lives about one
    #: interval before its commit, a prepared one about two
    trigger_timeouts: tuple[tuple[str, float], ...] = ()

    def target_class(self) -> type[Target]:
        return getattr(import_module(self.module), self.class_name)


_CLICKHOUSE = dict(product="clickhouse", module="streaming_sink.targets.clickhouse", class_name="ClickHouseTarget",
                   creates_tables=True, needs_user=False)
_STARROCKS = dict(product="starrocks", module="streaming_sink.targets.starrocks", class_name="StarRocksTarget",
                  creates_tables=False, needs_user=True, trigger_timeouts=(
                      ("load_timeout_s", 1), ("timeout", 1), ("prepared_timeout_s", 2), ("prepared_timeout", 2)))
_DORIS = dict(product="doris", module="streaming_sink.targets.doris", class_name="DorisTarget",
              creates_tables=False, needs_user=True, trigger_timeouts=(("load_timeout_s", 1),))

#: URL scheme -> target kind. The `...s` schemes are the same targets over https.
REGISTRY: dict[str, TargetKind] = {
    "chdb": TargetKind(transport="chdb", **_CLICKHOUSE),
    "clickhouse": TargetKind(transport="http", **_CLICKHOUSE),
    "clickhouses": TargetKind(transport="https", **_CLICKHOUSE),
    "http": TargetKind(transport="http", **_CLICKHOUSE),
    "https": TargetKind(transport="https", **_CLICKHOUSE),
    "starrocks": TargetKind(transport="http", **_STARROCKS),
    "starrockss": TargetKind(transport="https", **_STARROCKS),
    "doris": TargetKind(transport="http", **_DORIS),
    "doriss": TargetKind(transport="https", **_DORIS),
}


def target_kind(url: str) -> TargetKind:
    """The registry's entry for a target URL, or a ConfigurationError listing the schemes."""
    scheme = urlparse(url).scheme
    if scheme not in REGISTRY:
        raise ConfigurationError(f"target url {url!r}: scheme must be one of {sorted(REGISTRY)}")
    return REGISTRY[scheme]


def target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Target:
    """A target from `chdb:///path`, `clickhouse://host:8123`, `starrocks://fe:8030`, `doris://fe:8030`
    (StarRocks and Doris: several FEs as `starrocks://fe1:8030,fe2:8030`).

    Credentials never come from the URL (it ends up in configuration files and logs): they are
    read from STREAMING_SINK_TARGET_USER / STREAMING_SINK_TARGET_PASSWORD.
    """
    kind = target_kind(url)
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        raise ConfigurationError(
            f"target url: do not put credentials in it; set {USER_ENV} and {PASSWORD_ENV} in the environment"
        )
    cls = kind.target_class()
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    # several FEs, comma-separated (starrocks://fe1:8030,fe2:8030): the client fails over between them
    rebuilt = ",".join(urlunparse(parsed._replace(scheme=kind.transport, netloc=host.strip()))
                       for host in parsed.netloc.split(",")) if parsed.netloc else urlunparse(parsed._replace(scheme=kind.transport))
    if not kind.needs_user:
        return cls(rebuilt, database=database, user=user, password=password, **(options or {}))
    if not user:  # never a silent `root` with an empty password
        raise ConfigurationError(f"{parsed.scheme} needs a user: set {USER_ENV} (and {PASSWORD_ENV}) in the environment")
    return cls(fe_url=rebuilt, database=database, user=user, password=password or "", **(options or {}))


def target_option_names(url: str) -> set[str]:
    """The option names the target a URL names accepts (its `target.options` keys)."""
    return set(target_kind(url).target_class().option_names())
