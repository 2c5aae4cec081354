"""Targets: databases that take part in the sink's two-phase commit."""
from .base import CommitOutcome, ConfigurationError, Target, TargetError
from .clickhouse import ClickHouseTarget

__all__ = ["ClickHouseTarget", "CommitOutcome", "ConfigurationError", "Target", "TargetError"]
