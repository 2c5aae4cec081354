"""Targets: databases that take part in the sink's two-phase commit, and the one registry of them.

Each target's module defines its `DESCRIPTOR` (streaming_sink/targets/descriptor.py): the URL schemes
that name it, how it is built, its options, what it can do and what its columns hold. Config, job,
metrics, doctor and CLI read descriptors through this registry and never name a product. Adding a
target means its module with its descriptor, one line in `DESCRIPTORS`, and its test adapter.
"""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse, urlunparse

from ..errors import ConfigurationError
from . import clickhouse, doris, starrocks
from .base import CommitOutcome, Target, TargetError
from .clickhouse import ClickHouseTarget
from .descriptor import TargetDescriptor

__all__ = ["DESCRIPTORS", "REGISTRY", "ClickHouseTarget", "CommitOutcome", "ConfigurationError", "Target", "TargetDescriptor",
           "TargetError", "descriptor_for", "embedded_target_url", "is_path_url", "register", "target_from_url", "url_forms"]

USER_ENV = "STREAMING_SINK_TARGET_USER"
PASSWORD_ENV = "STREAMING_SINK_TARGET_PASSWORD"

#: the targets this release ships, in the order help texts list them
DESCRIPTORS: tuple[TargetDescriptor, ...] = (clickhouse.DESCRIPTOR, starrocks.DESCRIPTOR, doris.DESCRIPTOR)

#: URL scheme -> the descriptor of the target it names (`...s` schemes: the same targets over https)
REGISTRY: dict[str, TargetDescriptor] = {}


def register(descriptor: TargetDescriptor) -> None:
    """Make `descriptor`'s schemes name its target (a test's instrumented target takes over its product's schemes)."""
    for scheme in descriptor.schemes:
        REGISTRY[scheme] = descriptor


for _descriptor in DESCRIPTORS:
    register(_descriptor)


def descriptor_for(url: str) -> TargetDescriptor:
    """The descriptor of the target a URL names, or a ConfigurationError listing the schemes."""
    scheme = urlparse(url).scheme
    if scheme not in REGISTRY:
        raise ConfigurationError(f"target url {url!r}: scheme must be one of {sorted(REGISTRY)}")
    return REGISTRY[scheme]


def embedded_target_url(data_dir: str) -> str:
    """The target a job.toml without `target.url` writes to: the first target that embeds in the driver."""
    return next(d.embedded_url(data_dir) for d in DESCRIPTORS if d.embedded_url is not None)


def is_path_url(scheme: str) -> bool:
    """Whether a target URL with `scheme` names a local path (an embedded engine) rather than a host."""
    descriptor = REGISTRY.get(scheme)
    return descriptor is not None and descriptor.schemes[scheme] in descriptor.path_transports


def url_forms() -> str:
    """How target URLs are written, every registered target's forms, for help texts."""
    forms = dict.fromkeys(form for descriptor in REGISTRY.values() for form in descriptor.url_forms)
    return ", ".join(forms)


def target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Target:
    """A target from its URL, e.g. `chdb:///path`, `clickhouse://host:8123`, `starrocks://fe:8030` (several
    FEs as `starrocks://fe1:8030,fe2:8030`).

    Credentials never come from the URL (it ends up in configuration files and logs): they are
    read from STREAMING_SINK_TARGET_USER / STREAMING_SINK_TARGET_PASSWORD.
    """
    descriptor = descriptor_for(url)
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        raise ConfigurationError(
            f"target url: do not put credentials in it; set {USER_ENV} and {PASSWORD_ENV} in the environment"
        )
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if descriptor.needs_user and not user:  # never a silent `root` with an empty password
        raise ConfigurationError(f"{parsed.scheme} needs a user: set {USER_ENV} (and {PASSWORD_ENV}) in the environment")
    transport = descriptor.schemes[parsed.scheme]
    # several hosts, comma-separated (starrocks://fe1:8030,fe2:8030): the client fails over between them
    rebuilt = (",".join(urlunparse(parsed._replace(scheme=transport, netloc=host.strip())) for host in parsed.netloc.split(","))
               if parsed.netloc else urlunparse(parsed._replace(scheme=transport)))
    return descriptor.factory(rebuilt, database, user, password, options or {})
