"""The names this module had before the Committer (`committer.py`) and the operator's actions (`actions.py`)
moved out of it; kept for one release, for code written against them."""
from __future__ import annotations

from .actions import (
    Action, RecoveryAction, abort_batch, accept_loss, apply_recovery, check_journal_target, plan_recovery,
    settle_label, settle_record,
)
from .committer import STALE_QUERY_SECONDS, Committer, check_target, leftover_labels
from .errors import OperatorActionRefused, ReplayAmbiguousError, ReplayImpossibleError, TargetMismatchError

#: The Committer's name before it was called what it is: the committer of every batch, not only after a crash.
Recovery = Committer

__all__ = [
    "Action", "Committer", "OperatorActionRefused", "Recovery", "RecoveryAction", "ReplayAmbiguousError",
    "ReplayImpossibleError", "STALE_QUERY_SECONDS", "TargetMismatchError", "abort_batch", "accept_loss",
    "apply_recovery", "check_journal_target", "check_target", "leftover_labels", "plan_recovery", "settle_label",
    "settle_record",
]
