"""Read a StarRocks or Doris table's columns from the FE's `GET /api/{db}/{table}/_schema` endpoint, and its key
model where the FE tells it.

Why: values the table cannot hold must reach the dead-letter table with a reason, not become NULL on the
server (docs/protocol.md, "Common: strict mode"), so the sink needs the column types before it loads.

What the servers give (docs/protocol.md, "Common: table schema endpoint"): primitive type names only, so VARCHAR and
CHAR come without length and ARRAY/MAP/STRUCT without element types; decimals come with precision and scale.
Doris names DATEV2/DATETIMEV2 and DECIMAL32..256, StarRocks DECIMAL32..128; they are spelled DATE, DATETIME and
DECIMAL(p,s) here. Nullability is only reported by the newest Doris (`is_nullable`); a column it reports as
not nullable gets a trailing ` NOT NULL`, every other column is left unmarked (nullable or unknown).

Key models (docs/protocol.md, "StarRocks: primary key tables and `__op`", "Doris: unique key tables, delete sign and
sequence column"): Doris' `_schema` names the table's `keysType`, and a key column is the one without an
aggregation type (its value columns say NONE or REPLACE; the newest also says `is_key`). StarRocks' `_schema` tells
neither; its v2 schema API (3.3 on, assumed) does: `keysType`, and `isKey` per column.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from .http import AuthenticationError, HttpClient, HttpError, HttpStatusError, api_path, excerpt

_RENAMES = {"DATEV2": "DATE", "DATETIMEV2": "DATETIME", "JSONB": "JSON"}
_DECIMALS = re.compile(r"DECIMAL(V2|V3|32|64|128|256)?")


def _spell(prop: dict[str, Any]) -> str:
    """One property of the answer as an upper-case type, e.g. DECIMAL(10,2) or VARCHAR."""
    raw = re.sub(r"\s*([(),<>:])\s*", r"\1", str(prop.get("type", "")).strip()).upper()
    if _DECIMALS.fullmatch(raw) and prop.get("precision") not in (None, ""):
        raw = f"DECIMAL({int(prop['precision'])},{int(prop.get('scale') or 0)})"
    raw = _RENAMES.get(raw, raw)
    if str(prop.get("is_nullable", "")).strip().lower() in ("no", "false"):
        raw += " NOT NULL"
    return raw


@dataclass(frozen=True)
class TableModel:
    """A table's key model as its FE tells it: `keys_type` as the FE spells it (DUP_KEYS, AGG_KEYS, UNIQUE_KEYS,
    PRIMARY_KEYS) and `key`, its key columns in table order."""

    keys_type: str
    key: tuple[str, ...]


@dataclass(frozen=True)
class TableSchema:
    """One `_schema` answer: the columns (name -> type, see the module doc), and the key model where it says."""

    columns: dict[str, str]
    model: TableModel | None


def fetch_table_columns(client: HttpClient, database: str, table: str) -> dict[str, str] | None:
    """The table's columns in table order, name -> type (see the module doc for the spelling).

    None when the server has no such endpoint; ConfigurationError naming the table when it does not exist or the
    credentials are refused.
    """
    answer = fetch_table_schema(client, database, table)
    return None if answer is None else answer.columns


def fetch_table_schema(client: HttpClient, database: str, table: str) -> TableSchema | None:
    """The `_schema` answer read whole (None when the server has no such endpoint; errors as `fetch_table_columns`)."""
    what = f"table {database}.{table}"
    try:
        response = client.request("GET", api_path(database, table, "_schema"), idempotent=True, allow_status=(404, 405))
    except AuthenticationError as error:
        raise ConfigurationError(f"{what}: the server refused user {client.user!r} reading its schema: {error}") from None
    except HttpStatusError as error:
        raise ConfigurationError(f"{what}: reading its schema failed: {error}") from None
    except HttpError as error:
        raise ConfigurationError(f"{what}: could not read its schema: {error}") from None
    try:
        body = response.json()
    except HttpError:
        if response.status in (404, 405):
            return None  # not a StarRocks/Doris FE answer: the endpoint is not there
        raise ConfigurationError(f"{what}: the schema answer is not JSON: {excerpt(response.text)!r}") from None
    if not isinstance(body, dict):
        raise ConfigurationError(f"{what}: unexpected schema answer {excerpt(response.text)!r}")
    if "code" in body and "msg" in body:  # Doris httpv2 envelope; errors are HTTP 200 with code != 0
        if body.get("code") != 0:
            raise ConfigurationError(f"{what} cannot be used: {body.get('data') or body.get('msg')}")
        body = body.get("data") if isinstance(body.get("data"), dict) else {}
    status = body.get("status")
    if status is None and response.status in (404, 405):
        return None
    if status != 200 or not isinstance(body.get("properties"), list):
        reason = body.get("exception") or excerpt(response.text)
        raise ConfigurationError(f"{what} cannot be used: {reason}")
    properties = body["properties"]
    columns = {str(prop["name"]): _spell(prop) for prop in properties}
    keys_type = body.get("keysType")
    if not keys_type or not all("aggregation_type" in prop or "is_key" in prop for prop in properties):
        return TableSchema(columns, None)  # StarRocks, or an FE that does not say
    return TableSchema(columns, TableModel(str(keys_type), tuple(str(p["name"]) for p in properties if _is_key(p))))


def _is_key(prop: dict[str, Any]) -> bool:
    """Doris: `is_key` where the FE says it, else a column without an aggregation type (only key columns have none)."""
    if "is_key" in prop:
        return str(prop["is_key"]).strip().lower() in ("yes", "true")
    return not str(prop.get("aggregation_type") or "").strip()


def fetch_table_model_v2(client: HttpClient, database: str, table: str) -> TableModel | None:
    """StarRocks' v2 schema API: the table's keys type and key columns; None when the FE has no such API (before
    3.3, assumed); ConfigurationError naming the table when it does not exist or the credentials are refused."""
    what = f"table {database}.{table}"
    path = api_path("v2", "catalogs", "default_catalog", "databases", database, "tables", table, "schema")
    try:
        response = client.request("GET", path, idempotent=True, allow_status=(404, 405))
    except AuthenticationError as error:
        raise ConfigurationError(f"{what}: the server refused user {client.user!r} reading its schema: {error}") from None
    except HttpError as error:
        raise ConfigurationError(f"{what}: reading its key model failed: {error}") from None
    try:
        body = response.json()
    except HttpError:
        return None  # an FE without the v2 API answers its own 404 page
    if not isinstance(body, dict) or str(body.get("code")) != "0" or not isinstance(body.get("result"), dict):
        message = body.get("message") if isinstance(body, dict) else None
        raise ConfigurationError(f"{what} cannot be used: {message or excerpt(response.text)}")
    result = body["result"]
    columns = [c for c in result.get("columns") or [] if isinstance(c, dict)]
    return TableModel(str(result.get("keysType") or ""), tuple(str(c["name"]) for c in columns if c.get("isKey")))


__all__ = ["TableModel", "TableSchema", "fetch_table_columns", "fetch_table_model_v2", "fetch_table_schema"]
