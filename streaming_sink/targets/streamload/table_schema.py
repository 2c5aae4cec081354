"""Read a StarRocks or Doris table's columns from the FE's `GET /api/{db}/{table}/_schema` endpoint.

Why: values the table cannot hold must reach the dead-letter table with a reason, not become NULL on the
server (docs/protocol.md, "Common: strict mode"), so the sink needs the column types before it loads.

What the servers give (docs/protocol.md, "Common: table schema endpoint"): primitive type names only, so VARCHAR and
CHAR come without length and ARRAY/MAP/STRUCT without element types; decimals come with precision and scale.
Doris names DATEV2/DATETIMEV2 and DECIMAL32..256, StarRocks DECIMAL32..128; they are spelled DATE, DATETIME and
DECIMAL(p,s) here. Nullability is only reported by the newest Doris (`is_nullable`); a column it reports as
not nullable gets a trailing ` NOT NULL`, every other column is left unmarked (nullable or unknown).
"""
from __future__ import annotations

import re
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


def fetch_table_columns(client: HttpClient, database: str, table: str) -> dict[str, str] | None:
    """The table's columns in table order, name -> type (see the module doc for the spelling).

    None when the server has no such endpoint; ConfigurationError naming the table when it does not exist or the
    credentials are refused.
    """
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
    return {str(prop["name"]): _spell(prop) for prop in body["properties"]}


__all__ = ["fetch_table_columns"]
