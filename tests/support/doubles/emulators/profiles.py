"""Emulator profiles: the server version and settings one emulator instance plays.

Each emulator describes its configurable behaviour as a dataclass (``StarRocksProfile``, ``DorisProfile``);
wording and features that changed between releases are keyed on the version (docs/protocol.md,
"StarRocks: versions", "Doris: versions").
"""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Any


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def profile_fields(cls: type, overrides: dict[str, Any]) -> Any:
    """Build a profile dataclass, rejecting unknown settings (typos must not pass silently)."""
    known = {f.name for f in fields(cls)}
    unknown = set(overrides) - known
    if unknown:
        raise TypeError(f"unknown {cls.__name__} settings: {sorted(unknown)}; "
                        f"known: {sorted(known)}")
    return cls(**overrides)
