"""What the StarRocks and Doris targets share: both load through Stream Load behind an FE.

Their two-phase-commit state machines differ and stay in their own modules; what is the same
lives here, so a change to it is made once.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

import pyarrow as pa

from ...batch_plan import ServerLimits
from ...changes import CHANGE_COLUMNS, is_change_schema
from ...errors import ConfigurationError
from ..base import CommitOutcome, ExpiryKind, ExpiryLimit, Target, own_names
from ..encoding import EncodingError, check_header_names, columns_header
from .fe import FeClient
from .http import HttpClient
from .table_schema import TableModel, fetch_table_columns

log = logging.getLogger(__name__)

#: HttpClient keyword -> the shared option that sets it (`common_names` maps it to a product's own older name).
_HTTP_SETTINGS = {"connect_timeout": "connect_timeout_s", "read_timeout": "read_timeout_s", "retries": "retries",
                  "backoff_s": "backoff_s", "backoff_max_s": "backoff_max_s"}

@dataclass(frozen=True)
class LabelRetention:
    """How a product's FE forgets a finished label: `seconds` after it finished (FE setting `seconds_setting`),
    or sooner once the database holds more than `count` transactions of the kind `counted` says (`count_setting`)."""

    seconds_setting: str
    seconds: float
    count_setting: str
    count: int
    counted: str

    def __str__(self) -> str:
        days, hours = self.seconds / 86400, self.seconds / 3600
        span = f"{days:g} days" if days.is_integer() else f"{hours:g} h" if hours.is_integer() else f"{self.seconds:g} s"
        return f"{self.seconds_setting} ({span} by default), or more than {self.count_setting} ({self.count} by default) {self.counted}"


#: Why a server forgetting finished labels matters, for both products' `expiry_limits` notes.
_FORGOTTEN_LABELS = ("a batch whose commit was cut off (driver killed between commit and its record) can no longer be told "
                    "committed from lost, and the job stops for an operator instead of risking duplicates; ")


@dataclass(frozen=True)
class SharedOptions:
    """The options both targets take under the same names (their own options classes add the rest), and how
    both products' options are read: `parse`."""

    # Each product's options class sets these: its target's name in messages, its older option names (shared
    # name -> its own), its option of free-form Stream Load headers, the headers the target sets itself and the
    # options that set them.
    target: ClassVar[str]
    common_names: ClassVar[Mapping[str, str]]
    headers_option: ClassVar[str]
    managed_headers: ClassVar[frozenset[str]]
    managed_by: ClassVar[str]

    tables: tuple[str, ...] | None = None  # tables rows may be routed to; None: the server refuses unknown ones
    format: str = "csv"
    # A value its column cannot hold filters its row (counted against max_filter_ratio, 0 unless set)
    # instead of becoming NULL and counting as loaded (docs/protocol.md, Common: strict mode).
    strict_mode: bool = True
    backoff_s: float = 0.2  # the first pause before a repeat (streaming_sink/retry.py); each next one doubles
    backoff_max_s: float = 5.0  # no pause is longer
    commit_parallelism: int = 8
    verify: bool = True  # https: check the server's certificate
    ca_bundle: str | None = None  # https: a PEM file of the CAs to trust instead of the system's
    # https: consent to the FE's redirect to a plain-http BE, which then gets credentials and data unencrypted;
    # StarRocks FEs redirect only that way (docs/protocol.md, Common: redirects)
    allow_plain_http_redirect: bool = False
    # the FE's running-transaction limit per database, when it is not the release default (`server_limits`)
    max_running_txn_num_per_db: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> Self:
        """The options in the target's own names, checked the same way for both products: unknown names
        refused, `tables` a list, and the free-form Stream Load headers neither clashing with the ones the
        target sets itself nor depending on the order they were given in; then the product's own checks."""
        target, values = cls.target, own_names(options, cls.common_names, cls.target)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(f"{target}: unknown option(s) {unknown}; known: {sorted(known)}")
        if values.get("tables") is not None:
            if isinstance(values["tables"], str):
                raise ConfigurationError(f"{target}: `tables` must be a list of table names, not one string")
            values["tables"] = tuple(str(t) for t in values["tables"])
        key = cls.headers_option
        if key in values:
            headers = {str(k): str(v) for k, v in dict(values[key] or {}).items()}
            clash = sorted(k for k in headers if k.lower() in cls.managed_headers)
            if clash:
                raise ConfigurationError(
                    f"{target}: {key} {clash} are set by the target itself; use its options ({cls.managed_by}) instead")
            values[key] = tuple(sorted(headers.items()))
        parsed = cls(**cls._adjusted(values))
        running = parsed.max_running_txn_num_per_db
        if running is not None and (isinstance(running, bool) or not isinstance(running, int) or running < 1):
            raise ConfigurationError(f"{target}: max_running_txn_num_per_db must be a positive integer, got {running!r}")
        parsed._validate()
        return parsed

    @classmethod
    def _adjusted(cls, values: dict[str, Any]) -> dict[str, Any]:
        """A product's own rewriting of the checked values (none here)."""
        return values

    def _validate(self) -> None:
        """A product's own checks of the parsed options (none here)."""


@dataclass(frozen=True)
class Release:
    """The release an FE runs, as read once at start, and how the target learnt it (a phrase for `doctor`)."""

    version: tuple[int, ...] | None  # (major, minor, patch); None: the FE did not tell
    said: str


def release_numbers(text: str) -> tuple[int, ...] | None:
    """(major, minor, patch) from a release's name such as `3.3.5`, `3.3.5-ee` or `doris-2.1.8-rc01`."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in found.groups()) if found else None


class StreamLoadTarget(Target):
    """A target whose FE answers at `http` and whose loads use `options.wire_format()`.

    Subclasses name their product for messages (`display_name`) and their options class, and set up their
    own state in `_started`.
    """

    display_name: ClassVar[str]
    options_class: Any  # a SharedOptions dataclass
    label_retention: ClassVar[LabelRetention]  # the FE's defaults
    # the FE's default max_running_txn_num_per_db from each release on, (first release, default), oldest first
    running_defaults: ClassVar[tuple[tuple[tuple[int, ...], int], ...]]
    # the key model a table must have to take changes (changes.py), as the FE spells it, and how to create one
    change_model: ClassVar[tuple[str, str]]

    def __init__(
        self, fe_url: str = "http://127.0.0.1:8030", database: str = "db", user: str | None = "root", password: str = "",
        **options: Any,
    ) -> None:
        name = type(self).__name__
        if not database:
            raise ConfigurationError(f"{name}: database must not be empty")
        self.options = self.options_class.parse(options)
        if not isinstance(self.options.allow_plain_http_redirect, bool):  # a string "false" must not mean yes
            raise ConfigurationError(
                f"{name}: allow_plain_http_redirect must be true or false, got {self.options.allow_plain_http_redirect!r}"
            )
        try:
            self.http = HttpClient(fe_url, user, password, verify=self.options.ca_bundle or self.options.verify,
                                   allow_plain_redirect=self.options.allow_plain_http_redirect,
                                   **self.http_settings())
        except ValueError as error:
            raise ConfigurationError(f"{name} fe_url: {error}") from None
        self.fe_url, self.database, self.user = self.http.base_url, database, user
        self.fe = FeClient(self.http, self.display_name)
        self._models: dict[str, TableModel | None] = {}  # table -> its key model as the FE told it (driver only)
        self._release: Release | None = None  # the FE's release, read once at start (`routable_tables`)
        self._started()

    @classmethod
    def option_names(cls) -> set[str]:
        """The keyword options the constructor takes besides the address and credentials."""
        return {f.name for f in fields(cls.options_class)} | set(cls.options_class.common_names)

    def http_settings(self) -> dict[str, Any]:
        """The HTTP client's timeouts, retries and backoff, from this target's options."""
        own = self.options.common_names
        return {setting: getattr(self.options, own.get(shared, shared)) for setting, shared in _HTTP_SETTINGS.items()}

    def _started(self) -> None:
        """Per-target state, once the options and the client exist."""

    def routable_tables(self) -> set[str] | None:
        """Checks that an https FE may redirect to plain http, that the FE answers, the credentials work and the
        database exists (`FeClient.probe`); returns the `tables` option (None: any name, the server refuses unknown ones)."""
        self.require_plain_http_consent()
        self.fe.probe(self.database)
        if self._release is None:
            self._release = self._read_release()
            log.info("%s FE release: %s", self.display_name, self._release.said)
        return set(self.options.tables) if self.options.tables is not None else None

    def _read_release(self) -> Release:
        """A product's reading of its FE's release (none here)."""
        return Release(None, "the FE's release is not read")

    def running_limit(self) -> tuple[int, str]:
        """The FE's default max_running_txn_num_per_db for the release it runs, and why: the release read at start,
        else the least default of any release, since a limit assumed too high has the batch refused at begin."""
        release = self._release
        if release is None or release.version is None:
            least = min(limit for _, limit in self.running_defaults)
            why = "the FE's release is not read yet" if release is None else release.said
            return least, f"{why}: the least release default; set the option to the server's value"
        limit = [limit for first, limit in self.running_defaults if release.version >= first][-1]
        return limit, f"{release.said}: its release default"

    def leftover_transactions(self, label_prefix: str) -> list[str] | None:
        """None: neither product lists open transactions to the sink's user over HTTP.

        Their load APIs address one label (or txn id) at a time (docs/protocol.md, StarRocks: endpoints; Doris:
        commit and abort). `GET /api/show_proc` (`/transactions/<db id>/running`) lists them but needs the admin
        role (StarRocks ShowProcAction, Doris ShowAction.show_proc); StarRocks' BE `/api/transaction/list` shows
        only that BE's data-phase contexts, and a prepared transaction has none (docs/protocol.md, StarRocks:
        routing). SHOW PROC, SHOW TRANSACTION and information_schema.loads need the MySQL protocol.
        """
        return None

    def server_limits(self) -> ServerLimits:
        """The FE's running-transaction limit and label memory per database: the options' values (the FE's own
        setting names) where given, else the defaults of the FE's release (`running_limit`). Neither FE shows its
        configuration to the sink's user: ADMIN SHOW FRONTEND CONFIG needs the MySQL protocol and an admin (Doris) or
        OPERATE (StarRocks) privilege, and the HTTP APIs documented for either only set it (StarRocks
        `/api/_set_config`) or need ADMIN (Doris `/rest/v1/config/fe`)."""
        kept = self.label_retention
        default_running, why = self.running_limit()
        given_running = self.options.max_running_txn_num_per_db
        given_labels = getattr(self.options, kept.count_setting)
        labels = kept.count if given_labels is None else given_labels
        said = [f"max_running_txn_num_per_db {given_running} (configured)" if given_running is not None
                else f"max_running_txn_num_per_db {default_running} ({why})",
                f"{kept.count_setting} {'unlimited' if labels < 0 else labels} "
                f"({'configured' if given_labels is not None else 'release default'})"]
        return ServerLimits(given_running if given_running is not None else default_running,
                            None if labels < 0 else labels, f"{self.display_name}: " + "; ".join(said))

    def outage_limits(self, prepared: str, prepared_s: float, raise_prepared: str, raise_labels: str) -> list[ExpiryLimit]:
        """The two limits both products put on an outage (docs/protocol.md, StarRocks: label retention; Doris:
        timeouts and label retention): `prepared` transactions are rolled back after `prepared_s`; a finished
        label is forgotten as `label_retention` says. `raise_…`: the settings that raise them."""
        state, kept = prepared.split()[0], self.label_retention  # "prepared" or "pre-committed"
        return [
            ExpiryLimit(prepared, prepared_s, kind=ExpiryKind.PREPARED,
                        note=f"{state} data of a job that is down longer is rolled back by the server and loaded again "
                             f"from Kafka (retention permitting); {raise_prepared}"),
            ExpiryLimit("label history (FE default)", kept.seconds, kept.count, kind=ExpiryKind.LABELS,
                        note=_FORGOTTEN_LABELS + raise_labels),
        ]

    def forgotten(self, what: str, unclear: bool) -> CommitOutcome:
        """The outcome of a commit whose label the FE no longer knows (`what` says which, as the server answered):
        it never committed, or it finished and was forgotten, which cannot be told apart here, so the coordinator
        decides. `unclear`: a commit this call sent may have landed just before (LOST_AFTER_SEND)."""
        log.warning(
            "%s: it never committed, or it finished and was forgotten (%s)%s. Whether it was committed cannot be "
            "told here: the coordinator decides", what, self.label_retention,
            "; a commit of it this call sent may have landed just before" if unclear else "",
        )
        return CommitOutcome.LOST_AFTER_SEND if unclear else CommitOutcome.LOST

    def close(self) -> None:
        self.http.close()

    def require_plain_http_consent(self) -> None:
        """At start, before any data moves: both products' FEs redirect every load to a BE over plain http
        (docs/protocol.md, Common: redirects), so an https fe_url could never load without
        `allow_plain_http_redirect`; it is refused here in one line, not mid-load."""
        if self.http.uses_https and not self.options.allow_plain_http_redirect:
            raise ConfigurationError(
                f"{type(self).__name__} fe_url {self.fe_url} is https, but the FE redirects every load to a BE over "
                "plain http: set the target option "
                "allow_plain_http_redirect = true to accept that hop (credentials and data cross it unencrypted), "
                "or give fe_url as http"
            )

    def transport_warning(self) -> str | None:
        """What `allow_plain_http_redirect` lets through with an https fe_url, else None."""
        if not (self.http.uses_https and self.options.allow_plain_http_redirect):
            return None
        return ("fe_url is https and allow_plain_http_redirect is on: a load the FE redirects to a BE over plain http "
                "(StarRocks FEs always do) carries the credentials and data unencrypted over that hop; keep the BEs on "
                "a trusted network")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fe_url!r}, database={self.database!r}, user={self.user!r})"

    @property
    def commit_parallelism(self) -> int:
        return int(self.options.commit_parallelism)

    def check_schema(self, table: str, schema: pa.Schema) -> None:
        """Column names the wire format cannot send (the `columns` header is latin-1) fail before any data moves;
        so do changes (`changes.py`) into a table that cannot take them, where the FE tells the table's model."""
        try:
            check_header_names(schema, self.options.wire_format())
            if is_change_schema(schema):
                columns_header(schema)  # the op (and version) columns are named in the header, whatever the format
        except EncodingError as error:
            raise ConfigurationError(f"table {table!r}: {error}") from None
        if is_change_schema(schema):
            self._check_changes(table, schema)

    def _check_changes(self, table: str, schema: pa.Schema) -> None:
        """A change table must be of the product's keyed model (`change_model`) and its change columns integers."""
        wanted, how = self.change_model
        for name in CHANGE_COLUMNS:
            if name in schema.names and not pa.types.is_integer(schema.field(name).type):
                raise ConfigurationError(f"table {table!r}: change column {name} must be an integer, "
                                         f"not {schema.field(name).type}")
        model = self.table_model(table)
        if model is None:
            self._unknown_model(table)
        elif model.keys_type != wanted:
            raise ConfigurationError(
                f"table {self.database}.{table} takes changes (upserts and deletes), but it is a {model.keys_type} "
                f"table, which would keep deleted and replaced rows: changes need a {wanted} table ({how})")

    def _unknown_model(self, table: str) -> None:
        """What a product does when its FE does not tell a change table's model (none here: its loads refuse)."""

    def table_model(self, table: str) -> TableModel | None:
        """The table's key model as the FE tells it (None: it does not), read once per table."""
        if table not in self._models:
            self._models[table] = self._read_model(table)
        return self._models[table]

    def _read_model(self, table: str) -> TableModel | None:
        """A product's reading of the table's key model from its FE."""
        return None

    def table_key(self, table: str) -> tuple[str, ...] | None:
        """The key columns of a table of the keyed model changes need, as the FE tells them; None otherwise."""
        model = self.table_model(table)
        return model.key if model is not None and model.keys_type == self.change_model[0] and model.key else None

    def table_columns(self, table: str) -> dict[str, str] | None:
        """From the FE's `_schema` endpoint: type names without lengths (docs/protocol.md, Common: table schema endpoint)."""
        return fetch_table_columns(self.http, self.database, table)

