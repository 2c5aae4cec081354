"""Durations as job.toml and the operator commands spell them: "10 seconds", "500 ms", "2 minutes".

A leaf of its own, so the job (which checks timeouts against the trigger) and the configuration
(which reads the trigger) both use it without importing each other.
"""
from __future__ import annotations

import re
from typing import Any

from .errors import ConfigurationError

_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?|d|days?)\s*$")


def parse_interval(text: Any, key: str) -> float:
    match = _INTERVAL.match(str(text))
    if not match:
        hint = ' (to drain what is there and stop, write "available-now")' if str(text).lower().replace("-", "") in (
            "availablenow", "once") else ""
        raise ConfigurationError(
            f"{key}: {text!r} is not an interval; write e.g. \"10 seconds\", \"500 ms\" or \"2 minutes\"{hint}")
    unit = match.group(2)
    if unit == "ms" or unit.startswith("milli"):
        scale = 0.001
    else:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit[0]]
    return float(match.group(1)) * scale
