"""Debezium change events, read in Spark: a message's row, its op, its version, and why it is no event the job loads.

Debezium's JSON converter writes each row change as an envelope: `{"before": …, "after": …, "op": …, "source": {…}}`,
or, with `value.converter.schemas.enable`, the same envelope as the `payload` beside a `schema`. `op` is `c` (insert),
`r` (a row read by the initial snapshot), `u` (update) or `d` (delete); a delete is followed by a tombstone (a null
value) for log compaction, which the frame skips. Each function here is a Spark column over the message's text, so a
user's own `foreachBatch` pipeline can read change events the way the packaged job does (frame.py), then hand the rows
to `ExactlyOnceSink(change_key=...)` (changes.py has the row contract).
"""
from __future__ import annotations

from typing import Any

from .changes import DELETE, UPSERT


def change_row(message: Any) -> Any:
    """A Debezium change event's row as JSON text: `after` for an insert, a snapshot read or an update, `before` for a
    delete. The event is the message itself, or its `payload` when the converter wrote the schema beside it."""
    from pyspark.sql import functions as F

    event = _event(message)
    return F.when(event["op"] == F.lit("d"), event["before"]).otherwise(event["after"])


def change_op(message: Any) -> Any:
    """`__op` of a change event: an upsert for c (insert), r (snapshot read) and u (update), a delete for d."""
    from pyspark.sql import functions as F

    op = _event(message)["op"]
    return F.when(op.isin("c", "r", "u"), F.lit(UPSERT)).when(op == F.lit("d"), F.lit(DELETE))


def change_version(message: Any) -> Any:
    """`__version` of a change event: the source's log position (`source.lsn`, PostgreSQL) where the connector gives
    one, else the Kafka offset; both grow with a key's changes (Debezium keys records by the row's key)."""
    from pyspark.sql import functions as F

    return F.coalesce(_event(message)["source"]["lsn"], F.col("offset"))


def event_problem(message: Any) -> Any:
    """Why a message is not a change event the job loads (NULL: it is one, or a tombstone)."""
    from pyspark.sql import functions as F

    event = _event(message)
    op, row = event["op"], F.when(event["op"] == F.lit("d"), event["before"]).otherwise(event["after"])
    return F.when(message.isNull(), F.lit(None)).when(
        op.isNull(), F.lit("not a Debezium change event: no `op` (in the message or its `payload`)")).when(
        ~op.isin("c", "r", "u", "d"), F.concat(F.lit("Debezium op '"), op, F.lit(
            "' is not a row change (the job loads c, r, u and d; a truncate or a message is not loaded)"))).when(
        row.isNull(), F.concat(F.lit("Debezium op '"), op, F.lit("' carries no row (`after` for c, r, u; `before` for d)")))


def _event(message: Any) -> Any:
    """The change event's fields the job reads, from the message or, with the converter's schema, its `payload`."""
    from pyspark.sql import functions as F

    wrapped = F.from_json(message, "schema STRING, payload STRING")
    event = F.when(wrapped["schema"].isNotNull() & wrapped["payload"].isNotNull(), wrapped["payload"]).otherwise(message)
    return F.from_json(event, "before STRING, after STRING, op STRING, source STRUCT<lsn: BIGINT>")
