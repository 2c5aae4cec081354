"""What the StarRocks and Doris targets share: both load through Stream Load behind an FE.

Their two-phase-commit state machines differ and stay in their own modules; what is the same
lives here, so a change to it is made once.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

import pyarrow as pa

from ..encoding import EncodingError, check_header_names
from ..errors import ConfigurationError
from ..http import HttpClient
from .base import Target, own_names
from .table_schema import fetch_table_columns


class StreamLoadTarget(Target):
    """A target whose FE answers at `http` and whose loads use `options.wire_format()`."""

    fe_url: str
    database: str
    user: str
    http: HttpClient
    options: Any  # the target's own options; `wire_format()` and `commit_parallelism` are read here

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fe_url!r}, database={self.database!r}, user={self.user!r})"

    @property
    def commit_parallelism(self) -> int:
        return int(self.options.commit_parallelism)

    def check_schema(self, table: str, schema: pa.Schema) -> None:
        """Column names the wire format cannot send (the `columns` header is latin-1) fail before any data moves."""
        try:
            check_header_names(schema, self.options.wire_format())
        except EncodingError as error:
            raise ConfigurationError(f"table {table!r}: {error}") from None

    def table_columns(self, table: str) -> dict[str, str] | None:
        """From the FE's `_schema` endpoint: type names without lengths (docs/protocol.md, Common: table schema endpoint)."""
        return fetch_table_columns(self.http, self.database, table)


def option_values(
    options_class: type, options: Mapping[str, Any], common_names: Mapping[str, str], target: str,
    headers_key: str, managed_headers: frozenset[str], instead: str,
) -> dict[str, Any]:
    """The options in the target's own names, checked the same way for both products: unknown names
    refused, `tables` a list, and the free-form Stream Load headers (`headers_key`) neither clashing
    with the ones the target sets itself (`managed_headers`; `instead` names the options to use) nor
    depending on the order they were given in."""
    values = own_names(options, common_names, target)
    known = {f.name for f in fields(options_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigurationError(f"{target}: unknown option(s) {unknown}; known: {sorted(known)}")
    if values.get("tables") is not None:
        if isinstance(values["tables"], str):
            raise ConfigurationError(f"{target}: `tables` must be a list of table names, not one string")
        values["tables"] = tuple(str(t) for t in values["tables"])
    if headers_key in values:
        headers = {str(k): str(v) for k, v in dict(values[headers_key] or {}).items()}
        clash = sorted(k for k in headers if k.lower() in managed_headers)
        if clash:
            raise ConfigurationError(f"{target}: {headers_key} {clash} are set by the target itself; use its options ({instead}) instead")
        values[headers_key] = tuple(sorted(headers.items()))
    return values
