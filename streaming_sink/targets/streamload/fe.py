"""What an FE says, read one way for both products: its answers, its label states, and the label-state call.

Both products answer in two dialects (docs/protocol.md, StarRocks: endpoints; Doris: commit and abort):
a Stream Load answer or StarRocks transaction-API answer names its outcome `Status`/`Message`, a
RestBaseResult (`_cancel`, `_stream_load_2pc`, StarRocks' `get_load_state`) `status`/`msg`. `Answer`
reads either, so the targets decide on one type. A label's state is one of `LabelState`, asked through
`FeClient.label_state`, which both targets' start-up probe and outcome resolution use.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from ...errors import ConfigurationError, TargetError
from .http import AuthenticationError, HttpClient, HttpError, api_path, excerpt


class Dialect(Enum):
    """The keys an answer names its outcome and its explanation with."""

    LOAD = ("Status", "Message")  # Stream Load, StarRocks' transaction API
    REST = ("status", "msg")  # RestBaseResult: _cancel, _stream_load_2pc, StarRocks' get_load_state

    @property
    def status_key(self) -> str:
        return self.value[0]

    @property
    def message_key(self) -> str:
        return self.value[1]


#: How the products spell success: StarRocks `OK`, Doris `Success`.
_SUCCESS = frozenset({"OK", "Success"})
#: The statuses of an answer the server never gave: the connection failed, or HTTP itself did.
NO_ANSWER, HTTP_ERROR = "CONNECTION", "HTTP_ERROR"


@dataclass(frozen=True)
class Answer:
    """One FE or BE answer: its status and message, the whole body for the counts and ids it carries."""

    status: str
    message: str
    body: Mapping[str, Any] = field(default_factory=dict)
    applied: bool = True  # False only when the request surely never reached the server

    @classmethod
    def parse(cls, body: object, dialect: Dialect) -> Answer | None:
        """The answer in `body`, or None when it is not one of `dialect`."""
        if not isinstance(body, dict) or dialect.status_key not in body:
            return None
        return cls(str(body[dialect.status_key]), str(body.get(dialect.message_key) or ""), body)

    @classmethod
    def expect(cls, body: object, dialect: Dialect, what: str) -> Answer:
        """The answer in `body`; a TargetError quoting it when it is not one (`what`: the request, for the message)."""
        answer = cls.parse(body, dialect)
        if answer is None:
            raise TargetError(f"{what} answered without a {dialect.status_key!r} ({_excerpt_of(body, 200)!r})")
        return answer

    @classmethod
    def failed(cls, status: str, message: str, applied: bool) -> Answer:
        """No answer came: `status` is NO_ANSWER or HTTP_ERROR, `message` the client's error."""
        return cls(status, message, {}, applied)

    @property
    def ok(self) -> bool:
        return self.status in _SUCCESS

    @property
    def unclear(self) -> bool:
        """No answer from the server, yet the request may have reached it and been acted on."""
        return self.status in (NO_ANSWER, HTTP_ERROR) and self.applied

    @property
    def error_url(self) -> str | None:
        """Where the server keeps the rows it rejected, if it says."""
        url = self.body.get("ErrorURL")
        return str(url) if url else None

    @property
    def brief(self) -> str:
        """Status, message and the rejected rows' address, for messages."""
        text = f"{self.status}: {self.message}" if self.message else self.status
        return f"{text} (rejected rows: {self.error_url})" if self.error_url else text


def _excerpt_of(body: object, limit: int = 300) -> str:
    """An answer that is not what was expected, cut short enough for an error message."""
    return excerpt(str(body), limit)


class LabelState(StrEnum):
    """A label's state as `get_load_state` names it (docs/protocol.md, StarRocks: label states; Doris: label states)."""

    UNKNOWN = "UNKNOWN"  # never began, or finished and forgotten (label retention)
    PREPARE = "PREPARE"  # open: data may still arrive
    PREPARED = "PREPARED"  # StarRocks: prepared, invisible until committed
    PRECOMMITTED = "PRECOMMITTED"  # Doris: the same
    COMMITTED = "COMMITTED"
    VISIBLE = "VISIBLE"
    ABORTED = "ABORTED"

    @property
    def committed(self) -> bool:
        return self in (LabelState.COMMITTED, LabelState.VISIBLE)

    @property
    def gone(self) -> bool:
        """Nothing holds the label's data on the server, and nothing ever will be visible under it."""
        return self in (LabelState.ABORTED, LabelState.UNKNOWN)


#: The label the start-up probe asks about: its state does not matter, only that the FE answers.
PROBE_LABEL = "streaming_sink_connectivity_probe"


class FeClient:
    """The FE's label service: the one label-state call both targets use, and the start-up probe built on it.

    `get_load_state` answers as a RestBaseResult on StarRocks (`status`, `state`, `reason`) and in the httpv2
    envelope on Doris (`code`, `data`, `msg`); both are read here (docs/protocol.md, StarRocks: get_load_state;
    Doris: label states).
    """

    def __init__(self, http: HttpClient, product: str) -> None:
        self.http, self.product = http, product

    def label_state(self, database: str, label: str) -> tuple[LabelState, str]:
        """(state, the server's reason for it); raises ConfigurationError on refused credentials or a missing
        database, TargetError when the FE gives no usable answer."""
        fe = self.http.base_url
        try:
            body = self.http.request("GET", api_path(database, "get_load_state"), params={"label": label},
                                     idempotent=True).json()
        except AuthenticationError as error:
            raise ConfigurationError(f"{self.product} at {fe} refused the credentials: {error}") from None
        except HttpError as error:
            raise TargetError(
                f"{self.product} get_load_state for label {label} at {fe} failed: {error}. "
                "Is the FE up and fe_url its HTTP port (default 8030)?"
            ) from None
        state, reason, refusal = _read_state(body)
        if refusal is not None:
            if "database" in refusal.lower():
                raise ConfigurationError(
                    f"{self.product} database {database!r} at {fe}: {refusal}; create it, or fix `database`"
                )
            raise TargetError(f"{self.product} get_load_state for label {label} failed: {refusal}")
        try:
            return LabelState(state.upper()), reason
        except ValueError:
            raise TargetError(f"{self.product} get_load_state for label {label}: unknown state {state!r}") from None

    def probe(self, database: str) -> None:
        """At start, before any data moves: the FE answers, the credentials work and the database exists.
        `get_load_state` is the one read-only call of the load protocol that checks all three."""
        self.label_state(database, PROBE_LABEL)


def _read_state(body: object) -> tuple[str, str, str | None]:
    """(state, reason, refusal) from either product's `get_load_state` answer; refusal None when it answered."""
    if isinstance(body, dict) and "code" in body and "status" not in body:  # Doris' httpv2 envelope
        if body.get("code") != 0:
            return "", "", str(body.get("msg") or body.get("data") or _excerpt_of(body))
        return str(body.get("data")), "", None
    answer = Answer.parse(body, Dialect.REST)
    if answer is None:
        return "", "", f"unexpected answer {_excerpt_of(body)!r}"
    if answer.status.upper() != "OK":
        return "", "", answer.message or str(answer.body.get("message") or _excerpt_of(body))
    return str(answer.body.get("state", LabelState.UNKNOWN)), str(answer.body.get("reason") or ""), None
