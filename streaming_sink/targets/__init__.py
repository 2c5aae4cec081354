"""Targets: databases that take part in the sink's two-phase commit, and how a URL names one."""
from __future__ import annotations

import os
from importlib import import_module
from typing import Any
from urllib.parse import urlparse, urlunparse

from .base import CommitOutcome, ConfigurationError, Target, TargetError
from .clickhouse import ClickHouseTarget

__all__ = ["ClickHouseTarget", "CommitOutcome", "ConfigurationError", "Target", "TargetError", "target_from_url",
           "target_option_names"]

USER_ENV = "STREAMING_SINK_TARGET_USER"
PASSWORD_ENV = "STREAMING_SINK_TARGET_PASSWORD"

# scheme -> (module, class, scheme of the URL the class takes)
_SCHEMES = {
    "chdb": ("streaming_sink.targets.clickhouse", "ClickHouseTarget", "chdb"),
    "clickhouse": ("streaming_sink.targets.clickhouse", "ClickHouseTarget", "http"),
    "clickhouses": ("streaming_sink.targets.clickhouse", "ClickHouseTarget", "https"),
    "http": ("streaming_sink.targets.clickhouse", "ClickHouseTarget", "http"),
    "https": ("streaming_sink.targets.clickhouse", "ClickHouseTarget", "https"),
    "starrocks": ("streaming_sink.targets.starrocks", "StarRocksTarget", "http"),
    "starrockss": ("streaming_sink.targets.starrocks", "StarRocksTarget", "https"),
    "doris": ("streaming_sink.targets.doris", "DorisTarget", "http"),
    "doriss": ("streaming_sink.targets.doris", "DorisTarget", "https"),
}


def target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Target:
    """A target from `chdb:///path`, `clickhouse://host:8123`, `starrocks://fe:8030`, `doris://fe:8030`
    (StarRocks and Doris: several FEs as `starrocks://fe1:8030,fe2:8030`).

    Credentials never come from the URL (it ends up in configuration files and logs): they are
    read from STREAMING_SINK_TARGET_USER / STREAMING_SINK_TARGET_PASSWORD.
    """
    parsed = urlparse(url)
    if parsed.scheme not in _SCHEMES:
        raise ConfigurationError(f"target url {url!r}: scheme must be one of {sorted(_SCHEMES)}")
    if parsed.username or parsed.password:
        raise ConfigurationError(
            f"target url: do not put credentials in it; set {USER_ENV} and {PASSWORD_ENV} in the environment"
        )
    module, name, scheme = _SCHEMES[parsed.scheme]
    cls = getattr(import_module(module), name)
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    # several FEs, comma-separated (starrocks://fe1:8030,fe2:8030): the client fails over between them
    rebuilt = ",".join(urlunparse(parsed._replace(scheme=scheme, netloc=host.strip()))
                       for host in parsed.netloc.split(",")) if parsed.netloc else urlunparse(parsed._replace(scheme=scheme))
    if name == "ClickHouseTarget":
        return cls(rebuilt, database=database, user=user, password=password, **(options or {}))
    if not user:  # never a silent `root` with an empty password
        raise ConfigurationError(f"{parsed.scheme} needs a user: set {USER_ENV} (and {PASSWORD_ENV}) in the environment")
    return cls(fe_url=rebuilt, database=database, user=user, password=password or "", **(options or {}))


def target_option_names(url: str) -> set[str]:
    """The option names the target a URL names accepts (its `target.options` keys)."""
    scheme = urlparse(url).scheme
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"target url {url!r}: scheme must be one of {sorted(_SCHEMES)}")
    module, name, _ = _SCHEMES[scheme]
    cls = getattr(import_module(module), name)
    return set(cls.option_names())
