"""Fault-injection knobs: a request-level failure armed for the next N matching requests.

A test arms a knob (``emu.faults.http_5xx.arm(label=...)``, or over HTTP through the admin API) and the
emulator applies it to the next requests that match its op, label or listener role. ``GENERIC_KNOBS``
are the ones ``BaseEmulator`` implements for both products; each emulator adds its own.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """What a request is, for knob matching: the protocol op, its label/db and the listener role."""

    op: str
    role: str
    label: str | None = None
    db: str | None = None


@dataclass
class _Arm:
    times: int
    label: str | None
    op: str | None
    role: str | None
    params: dict[str, Any]


class Knob:
    """One fault, armed for the next ``times`` matching requests (optionally one label/op/role)."""

    def __init__(self, name: str, doc: str = "") -> None:
        self.name = name
        self.__doc__ = doc
        self._arms: list[_Arm] = []
        self._lock = threading.Lock()
        self.fired = 0

    def arm(self, times: int = 1, label: str | None = None, op: str | None = None,
            role: str | None = None, **params: Any) -> Knob:
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._arms.append(_Arm(times, label, op, role, dict(params)))
        return self

    def disarm(self) -> None:
        with self._lock:
            self._arms.clear()

    @property
    def armed(self) -> bool:
        with self._lock:
            return bool(self._arms)

    def take(self, call: Call) -> dict[str, Any] | None:
        """Consume one arming that matches ``call``; return its params (a dict, maybe empty)."""
        with self._lock:
            for arm in self._arms:
                if arm.label is not None and arm.label != call.label:
                    continue
                if arm.op is not None and arm.op.lower() != call.op.lower():
                    continue
                if arm.role is not None and arm.role != call.role:
                    continue
                arm.times -= 1
                if arm.times <= 0:
                    self._arms.remove(arm)
                self.fired += 1
                return dict(arm.params)
        return None


class Faults:
    """The knob set of one emulator; each knob is an attribute (``emu.faults.http_5xx.arm()``)."""

    def __init__(self, knobs: dict[str, str]) -> None:
        self._knobs = {name: Knob(name, doc) for name, doc in knobs.items()}
        # Set to cut every pending ``slow_response`` short (tests, stop()).
        self.wake = threading.Event()

    def __getattr__(self, name: str) -> Knob:
        knobs = self.__dict__.get("_knobs", {})
        if name in knobs:
            return knobs[name]
        raise AttributeError(f"unknown fault knob {name!r}; known: {sorted(knobs)}")

    def names(self) -> list[str]:
        return sorted(self._knobs)

    def reset(self) -> None:
        for knob in self._knobs.values():
            knob.disarm()

    def release(self) -> None:
        """Let every delayed answer go now; later arms wait again."""
        old, self.wake = self.wake, threading.Event()
        old.set()


# The knobs both emulators implement generically in BaseEmulator (product-specific ones are
# added by each emulator). Values are short docs, surfaced by the admin API.
GENERIC_KNOBS: dict[str, str] = {
    "drop_connection_before": "close the socket without acting or answering",
    "http_5xx": "answer HTTP `status` (default 503) without acting",
    "slow_response": "act, then delay the answer by `seconds` (default 1) on an Event",
    "drop_connection_after": "act on any request, then close the socket without an answer",
    "drop_connection_after_commit": "apply a commit, then close the socket without an answer",
    "expire_prepared": "time out the label's prepared/pre-committed txn before handling",
}
