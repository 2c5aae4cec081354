"""A target's descriptor: every fact about one product that the job, config, metrics, doctor and CLI
need, in one value defined beside the target's code. Outside `targets/` no module names a product:
they read the descriptor (tests/unit/test_target_descriptors.py holds that)."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import Target
from .columns import ColumnRules

#: (transport URL(s), database, user, password, options) -> a target; several FEs come comma-separated
TargetFactory = Callable[[str, str, "str | None", "str | None", Mapping[str, Any]], Target]


@dataclass(frozen=True)
class NeededModule:
    """A module a transport needs that the base install leaves out, and the pip extra that brings it."""

    module: str
    extra: str
    what: str  # what the transport is, for the message


@dataclass(frozen=True)
class TargetDescriptor:
    """One target product: how URLs name it, how it is built, what it can do and what its columns hold."""

    product: str  # the `kind` its transactions record in the journal
    display_name: str  # the product as messages name it
    schemes: Mapping[str, str]  # URL scheme -> the transport its class takes (chdb | http | https)
    url_forms: tuple[str, ...]  # how users write its URL, for help and messages
    factory: TargetFactory
    option_names: frozenset[str]  # its `target.options` keys
    columns: ColumnRules
    creates_tables: bool = False  # `target.create_tables` can create missing tables from the job's schemas
    needs_user: bool = False  # a user is required (no silent default login)
    #: options that must outlast the trigger interval, with the factor: a transaction lives about one
    #: interval before its commit, a prepared one about two
    trigger_timeouts: tuple[tuple[str, float], ...] = ()
    needs_module: Mapping[str, NeededModule] = field(default_factory=dict)  # transport -> what it needs installed
    #: schemes users mistake for this target's (e.g. the MySQL port) -> what to write instead
    scheme_hints: Mapping[str, str] = field(default_factory=dict)
    #: transports whose URL is a local absolute path (an engine embedded in the driver), not a host
    path_transports: frozenset[str] = frozenset()
    #: the URL of an embedded engine under a job's data folder, for a job.toml that names no target
    embedded_url: Callable[[str], str] | None = None

    def module_needed(self, scheme: str) -> NeededModule | None:
        """What a URL with `scheme` needs installed beyond the base install, if anything."""
        return self.needs_module.get(self.schemes[scheme])


def keyword_options(cls: type[Target], *taken: str) -> frozenset[str]:
    """The options a target class's constructor takes: its parameters besides `taken` (address, database,
    credentials), read from the signature so the list cannot drift from it."""
    parameters = inspect.signature(cls.__init__).parameters
    return frozenset(name for name in parameters if name not in ("self", *taken)
                     and parameters[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
