"""Kafka records -> the rows of each table the packaged job writes, or dead letters with the reason.

Each message is routed to a table (by a field of the message, or by its topic), parsed with that
table's schema, and checked against the table's column types (value_checks.py). A message that
cannot be routed or parsed, lacks a required (NOT NULL) field, or holds a value its column cannot
hold becomes a dead letter with its raw value, topic, partition, offset, Kafka timestamp and the
reason. A top-level JSON field the table's schema lacks is never dropped in silence: such messages
are counted per table (Spark's observed metrics, hence /metrics), and `on_unknown_field` sends them to
the dead letters, lets them through without the field, or fails the batch. Every column is derived
from the Kafka record alone, so a re-run batch produces the same rows (the replay checksum depends on it).
"""
from __future__ import annotations

import datetime as dt
import json
import operator
import re
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from .changes import DELETE, OP_COLUMN, POSITION_COLUMN, VERSION_COLUMN, table_columns
from .debezium import change_op, change_row, change_version, event_problem
from .errors import ConfigurationError
from .job_spec import JobSpec
from .metrics import OBSERVED_NAME, TOMBSTONES_OBSERVED, UNKNOWN_FIELDS_OBSERVED
from .projection import INTERNAL_PREFIX, Projection, plan_projection, projected, spark_reason
from .targets import descriptor_for
from .targets.base import Target
from .targets.columns import ColumnRules, column_key
from .value_checks import value_problems

ROUTE_COLUMN = "__table"
_BAD_COLUMN = "__streaming_sink_bad"  # only between build_frame's select and its observe
_UNKNOWN_COLUMN = "__streaming_sink_unknown"  # likewise: the table of a message with unknown fields, else NULL
_INTERNAL = INTERNAL_PREFIX  # the frame's columns between its stages (a `select` may not name them)
_ROUTE, _REASON, _FATAL = _INTERNAL + "route", _INTERNAL + "reason", _INTERNAL + "fatal"
_TEXT, _TABLE, _KEYS = _INTERNAL + "text", _INTERNAL + "table", _INTERNAL + "keys"  # stage 0 of build_frame
_MESSAGE, _OP, _VERSION, _EVENT = _INTERNAL + "message", _INTERNAL + "op", _INTERNAL + "version", _INTERNAL + "event"
_TOMBSTONE = _INTERNAL + "tombstone"  # a change event's null value after a delete: skipped, counted
#: How a batch that met fields to add as columns fails (on_unknown_field = "add-column"): `columns_to_add` reads it.
_ADD_COLUMNS = "columns to add to "
_ADDED = re.compile(re.escape(_ADD_COLUMNS) + r"(?P<table>.+?): (?P<fields>\[.*?\]) \(sink\.on_unknown_field")
#: Top-level columns of a change row for the sink's one-change-per-key rule (latest_changes.py): the row's key, as the
#: JSON of its key columns (tables differ in their keys), its `__op` (NULL: not a change: a dead letter) and `__version`.
CHANGE_KEY_COLUMN = "__key"
_DECIMAL_DIGITS = 38  # Spark's widest DECIMAL
_SLOT = "__s"  # a slot column of the frame's output: `__s<type>_<k>`, the k-th column of that type of any table
if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

#: table -> ((column, slot), ...): where each table's columns ride in the frame (`routing.Router.table_slots`)
TableSlots = dict[str, tuple[tuple[str, str], ...]]

DEAD_LETTER_COLUMNS = "raw_value STRING, topic STRING, partition INT, offset BIGINT, kafka_timestamp TIMESTAMP, reason STRING"


def resolve_tables(
    spec: JobSpec, target_tables: set[str] | None, refusal: Callable[[str], str | None] = lambda table: None
) -> dict[str, str]:
    """Table -> schema, checked against what the target has, before anything is read. A table the target
    has but will not load (`Target.refusal`: its engine, say) is refused with the target's reason."""
    if spec.tables is not None:
        tables = dict(spec.tables)
    else:
        if target_tables is None:
            raise ConfigurationError("this target cannot list its tables: give `tables` with a schema per table")
        names = {spec.table} if spec.table else set(spec.topic_tables.values()) if spec.topic_tables else target_tables
        assert spec.schema is not None  # JobSpec: without `tables`, one schema for every table
        tables = {name: spec.schema for name in names}
    if spec.dead_letter_table:
        tables.pop(spec.dead_letter_table, None)
    # Sorted: the frame's column order must not depend on set order (hash seeds differ per process),
    # or a re-run batch would carry the same rows in a different layout and fail its replay checksum.
    tables = dict(sorted(tables.items()))
    if target_tables is not None:
        missing = sorted((set(tables) | ({spec.dead_letter_table} if spec.dead_letter_table else set())) - target_tables)
        reasons = [why for why in map(refusal, missing) if why]
        if reasons:
            raise ConfigurationError("; ".join(reasons))
        if missing:
            raise ConfigurationError(
                f"table(s) {missing} do not exist in the target database {spec.database!r} (or are not loadable there); "
                f"create them first (target.create_tables creates missing tables only on a target that can; see "
                f"docs/configuration.md). The target has: {sorted(target_tables)}"
            )
    return tables


def build_frame(raw: DataFrame, spec: JobSpec, tables: dict[str, str],
                column_types: dict[str, dict[str, str] | None] | None = None,
                unavailable: Mapping[str, str] | None = None,
                keys: Mapping[str, tuple[str, ...]] | None = None) -> DataFrame:
    """Kafka records -> one route column plus typed slot columns, which carry the routed table's columns where
    `table_slots(spec, tables)` puts them (the frame is as wide as its widest table, whatever the tables' number).

    `column_types` are the target's, per table (`Target.table_columns`): a value its column
    cannot hold makes the message a dead letter naming the column (streaming_sink/value_checks.py).
    `unavailable`: tables `routing.topic_table` derives that the job cannot load, and why (target_tables.py).
    `keys`: with change events (`spec.changes`), each table's key columns; the frame then also has the top-level
    `__key`, `__op` and `__version` columns the sink keeps one change per key by (`ExactlyOnceSink(change_key=...)`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    rules = descriptor_for(spec.target_url).columns
    column_types, keys = column_types or {}, keys or {}
    message = F.col("value").cast("string")
    value = change_row(message) if spec.changes else message  # the JSON object of the table's fields
    if spec.table:
        route = F.lit(spec.table)
    elif spec.table_field:
        # from_json, not get_json_object: it reads what the tables' parsing reads (NaN included), so a
        # message with a NaN is routed and its reason names the column rather than the routing field
        route = F.from_json(value, StructType([StructField(spec.table_field, StringType(), True)]))[spec.table_field]
    elif spec.topic_table:
        whole = f"^(?:{spec.topic_table})$"  # the whole topic, as Kafka matches a subscription pattern
        # one regex per message: regexp_extract gives "" for a topic it does not match, as for an empty group
        route = F.nullif(F.regexp_extract(F.col("topic"), whole, 1), F.lit(""))
    else:
        assert spec.topic_tables is not None  # JobSpec: exactly one way to route
        mapping = F.create_map(*[F.lit(x) for pair in spec.topic_tables.items() for x in pair])
        route = mapping[F.col("topic")]

    # Stage 0: what every table's expressions read (the message as text, its route, its top-level keys: NULL for one
    # that is not a JSON object), computed once per message rather than once per table
    change = [event_problem(message).alias(_EVENT), change_op(message).alias(_OP), change_version(message).alias(_VERSION)] \
        if spec.changes else []
    raw = raw.select("*", message.alias(_MESSAGE), value.alias(_TEXT), route.alias(_TABLE),
                     F.json_object_keys(value).alias(_KEYS), *change)
    message, value, route, fields_of = F.col(_MESSAGE), F.col(_TEXT), F.col(_TABLE), F.col(_KEYS)
    tombstone = message.isNull() if spec.changes else F.lit(False)

    inputs = []  # each table's input row: its parsed fields and the metadata columns
    projections = table_projections(spec, tables)

    def target_type(table: str, name: str) -> str | None:
        """How the target spells the type of the table's column of that name (None: it cannot tell)."""
        types = {column_key(rules, column): kind for column, kind in (column_types.get(table) or {}).items()}
        return types.get(column_key(rules, name))

    def column_problems(table: str, field: Any, column: Any, text: Any = None) -> list[tuple[Any, str]]:
        """(condition, reason) for the values of `column` its table's column of that name cannot hold (`text`: the
        field's JSON text, for a check the parsed value cannot make)."""
        return value_problems(table, field, column, rules.limits(target_type(table, field.name)), text)

    utf8 = F.is_valid_utf8(message)
    reason = F.when(tombstone, F.lit(None)).when(message.isNull(), F.lit("message has no value")).when(
        ~utf8, F.lit("message is not valid UTF-8 (raw_value holds its bytes in base64)")
    )
    if spec.changes:
        reason = reason.when(F.col(_EVENT).isNotNull(), F.col(_EVENT))
    if any(source == "key" for source, _, _ in spec.metadata()):
        key = F.col("key").cast("string")
        reason = reason.when(key.isNotNull() & ~F.is_valid_utf8(key), F.lit("the record's key is not valid UTF-8 text"))
    reason = reason.when(route.isNull(), _no_route(spec)).when(~route.isin(list(tables)), _unknown_table(spec, route, unavailable))
    # the table of a message with fields its schema lacks: one flat CASE (nested ones overflow Spark's stack at
    # a few hundred tables), begun with a branch that never holds
    unknown_fields_of = F.when(F.lit(False), F.lit(None).cast("string"))
    fatal = F.when(F.lit(False), F.lit(None).cast("string"))  # why the batch must fail (on_unknown_field = "fail")
    key_of = F.when(F.lit(False), F.lit(None).cast("string"))  # a change row's key (CHANGE_KEY_COLUMN)
    for table, ddl in tables.items():
        schema = spark_schema(ddl, f"tables.{table}.schema")
        parse_schema = StructType(
            [StructField(f.name, _parsed_type(f.dataType), True) for f in schema.fields if f.name != spec.table_field]
            + [StructField("__corrupt", StringType(), True)]
        )
        mine = route == F.lit(table)
        # parsed only for the messages routed here: with hundreds of tables, one parse per message, not one per table
        parsed = F.when(mine, F.from_json(value, parse_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "__corrupt"}))
        typed = {f.name: parsed[f.name] if _parsed_type(f.dataType) == f.dataType else parsed[f.name].cast(f.dataType)
                 for f in schema.fields if f.name in parse_schema.names}  # the schema's types, once the checks have seen
        key_columns = keys.get(table) or () if spec.changes else ()
        deleted = F.col(_OP) == F.lit(DELETE) if spec.changes else F.lit(False)
        # a delete sets nothing but its key (changes.py): its other fields are not the table's values, so they are
        # not held to the table's columns (a full `before` image may hold what a column no longer takes)
        keyed = reduce(operator.or_, [parsed[name].isNull() for name in key_columns], ~deleted)
        reason = reason.when(mine & keyed & parsed["__corrupt"].isNotNull(), _unparsed(
            table, [f for f in schema.fields if f.name in parse_schema.names], parsed, value, partial(target_type, table)))
        if spec.changes:
            for f in parse_schema.fields:
                placeholder = _unavailable_value(parsed[f.name], f.dataType)
                if placeholder is not None:
                    reason = reason.when(mine & ~deleted & placeholder, F.lit(_UNAVAILABLE_REASON.format(column=f.name, table=table)))
        if spec.changes and (not key_columns or any(name not in parse_schema.names for name in key_columns)):
            raise ConfigurationError(f"tables.{table}.key: {list(key_columns)} must name fields of its schema "
                                     f"({', '.join(f.name for f in schema.fields)})")
        for f in schema.fields:
            if not f.nullable or f.name in key_columns:
                # a delete needs only its key: Debezium's `before` holds nothing else by default (replica identity)
                missing = parsed[f.name].isNull() & (~deleted if f.name not in key_columns else F.lit(True))
                reason = reason.when(mine & missing, F.lit(f"required field {f.name!r} of {table} is missing or null"))
        if table not in projections:  # else the select's output is what the table's columns must hold (stage 2)
            for f in parse_schema.fields:
                if f.name != "__corrupt":
                    checked = mine if f.name in key_columns else mine & ~deleted
                    for problem, text in column_problems(table, f, parsed[f.name], _json_text(value, f)):
                        reason = reason.when(checked & problem, F.lit(text))
        known = [f.name for f in schema.fields] + ([spec.table_field] if spec.table_field else [])
        unknown = F.when(mine, F.array_except(F.coalesce(fields_of, F.array().cast("array<string>")), F.array(*map(F.lit, known))))
        has_unknown = mine & (F.size(unknown) > 0)
        unknown_fields_of = unknown_fields_of.when(has_unknown, F.lit(table))
        why = F.concat(F.lit(f"field(s) not in the schema of {table}: "), F.array_join(unknown, ", "),
                       F.lit(f' (sink.on_unknown_field = "{spec.on_unknown_field}")'))
        if spec.on_unknown_field == "dead-letter":
            reason = reason.when(has_unknown, why)
        elif spec.on_unknown_field == "fail":
            fatal = fatal.when(has_unknown, why)
        elif spec.on_unknown_field == "add-column":  # the job adds the columns and runs the batch again (job.py)
            fatal = fatal.when(has_unknown, F.concat(F.lit(f"{_ADD_COLUMNS}{table}: "), F.to_json(unknown),
                                                     F.lit(' (sink.on_unknown_field = "add-column")')))
        fields = [(_deleted_value(typed[f.name], f.dataType, deleted) if spec.changes and f.name not in key_columns
                   else typed[f.name]).alias(f.name) for f in schema.fields if f.name in parse_schema.names]
        fields += [F.col(source).cast("string").alias(name) if source == "key" else F.col(source).alias(name)
                   for source, name, _ in spec.metadata()]
        if spec.changes:
            key_of = key_of.when(mine, F.to_json(F.struct(*[typed[name].alias(name) for name in key_columns])))
            fields += [F.col(_OP).alias(OP_COLUMN), F.col(_VERSION).alias(VERSION_COLUMN)]
        inputs.append(F.when(mine, F.struct(*fields)))

    # Stage 1: what every message is (route, reason, each table's input row), under the frame's own names only, so
    # that a projection stage can put a table's fields at the top level without meeting a Kafka column's name.
    coordinates = {"topic": F.col("topic"), "partition": F.col("partition"), "offset": F.col("offset"),
                   "kafka_timestamp": F.col("timestamp"), "raw_value": F.when(utf8, message).otherwise(F.base64(F.col("value")))}
    change_columns = [key_of.alias(CHANGE_KEY_COLUMN), F.col(_OP).alias(OP_COLUMN), F.col(_VERSION).alias(VERSION_COLUMN),
                      F.col("offset").alias(POSITION_COLUMN), tombstone.alias(_TOMBSTONE)] if spec.changes else []
    frame = raw.select(
        route.alias(_ROUTE), reason.alias(_REASON), fatal.alias(_FATAL), unknown_fields_of.alias(_UNKNOWN_COLUMN),
        *change_columns,
        *[column.alias(_INTERNAL + name) for name, column in coordinates.items()],
        *[row.alias(_input_column(index)) for index, row in enumerate(inputs)],
    )
    route, at = F.col(_ROUTE), {name: F.col(_INTERNAL + name) for name in coordinates}
    # Stage 2, per table with a `select`: its fields at the top level, each output column tried on its own
    rows = {table: F.col(_input_column(index)) for index, table in enumerate(tables)}
    failed = F.lit(None).cast("string")  # why a projection could not be computed for the message
    for index, (table, projection) in enumerate(projections.items()):
        carried = [F.col(name) for name in frame.columns]
        source = F.col(_input_column(list(tables).index(table)))
        frame = frame.select(*carried, *[source.getField(name).alias(name) for name in projection_inputs(spec, tables[table]).names])
        outputs = [(name, _INTERNAL + f"p{index}_{position}", tried)
                   for position, (name, tried) in enumerate(projected(projection))]
        frame = frame.select(*carried, *[tried.alias(column) for _, column, tried in outputs])
        mine = route == F.lit(table)
        for field, (name, column, _) in zip(projection.output.fields, outputs, strict=True):
            for problem, text in reversed(column_problems(table, field, F.col(column).getField("v"))):
                failed = F.when(mine & problem, F.lit(text)).otherwise(failed)
            failed = F.when(mine & F.col(column).isNull(), F.lit(
                f"{projection.key}: column {name!r} could not be computed for this message (Spark raised an error "
                "evaluating it: a bad cast, an overflow, a division by zero...)")).otherwise(failed)
        rows[table] = F.struct(*[F.col(column).getField("v").alias(name) for name, column, _ in outputs])
    reason = F.coalesce(F.col(_REASON), failed)

    # Stage 3: each message to its table, or to the dead letters with its reason
    bad = reason.isNotNull()
    members = [(table, (route == F.lit(table)) & ~bad, row) for table, row in rows.items()]
    if spec.dead_letter_table:
        raw_value = at["raw_value"]
        room = rules.raw_value_room((column_types.get(spec.dead_letter_table) or {}).get("raw_value"))
        if room is not None:  # a message longer than raw_value holds: kept in Kafka, named by its coordinates
            too_long = F.octet_length(raw_value) > F.lit(room)
            reason = F.when(too_long, F.concat(reason, F.lit(
                f"; raw_value left empty: the message is longer than the {room} bytes the column holds, "
                "it stays in Kafka at the topic, partition and offset of this row"))).otherwise(reason)
            raw_value = F.when(too_long, F.lit(None)).otherwise(raw_value)
        dead = F.struct(
            raw_value.alias("raw_value"), at["topic"].alias("topic"), at["partition"].alias("partition"),
            at["offset"].alias("offset"), at["kafka_timestamp"].alias("kafka_timestamp"), reason.alias("reason"),
        )
        routed = F.when(bad, F.lit(spec.dead_letter_table)).otherwise(route)
        members.append((spec.dead_letter_table, bad, dead))
    else:
        # No dead-letter table: the batch fails, and the error names the record and the reason.
        routed = F.when(bad, _unroutable(at, reason, "; configure a dead-letter table")).otherwise(route)
    # a route no table has fails the batch in its writers, naming the message (routing.Router)
    routed = F.when(F.col(_FATAL).isNotNull(), _unroutable(at, F.col(_FATAL), "")).otherwise(routed)
    # Each slot holds the value of the one table whose condition holds (the conditions exclude each other): a null
    # struct per table would cost every table's buffers in every Arrow row shipped to the writers.
    layout, kinds = _slot_layout(row_schemas(spec, tables, projections))
    slot_values: dict[str, list[Any]] = {slot: [] for slot in kinds}
    for table, condition, row in members:
        for column, slot in layout[table]:
            slot_values[slot].append(F.when(condition, row.getField(column).cast(kinds[slot])))
    # Records in and dead letters also go to Spark's progress (`observedMetrics`, the Spark UI). `observe`
    # passes rows through unchanged; `bad` rides along as a column only so it is not computed twice.
    # a change row's top-level key, op and version: a dead letter is not a change (NULL op), a tombstone is no row
    changes = [F.when(~bad, F.col(name)).alias(name) for name in (CHANGE_KEY_COLUMN, OP_COLUMN)] \
        + [F.col(VERSION_COLUMN), F.col(POSITION_COLUMN), F.col(_TOMBSTONE)] if spec.changes else [F.lit(False).alias(_TOMBSTONE)]
    return frame.select(
        routed.alias(ROUTE_COLUMN),
        *[F.coalesce(*sources).alias(slot) for slot, sources in slot_values.items()],
        *changes,
        bad.alias(_BAD_COLUMN),
        F.col(_UNKNOWN_COLUMN),
    ).observe(
        OBSERVED_NAME, F.count(F.lit(1)).alias("records_in"), F.count_if(F.col(_BAD_COLUMN)).alias("dead_letters"),
        F.map_from_arrays(F.array(*map(F.lit, tables)), F.array(
            *[F.count_if(F.col(_UNKNOWN_COLUMN) == F.lit(table)) for table in tables])).alias(UNKNOWN_FIELDS_OBSERVED),
        F.count_if(F.col(_TOMBSTONE)).alias(TOMBSTONES_OBSERVED),
    ).filter(~F.col(_TOMBSTONE)).drop(_BAD_COLUMN, _UNKNOWN_COLUMN, _TOMBSTONE)


def columns_to_add(error: str) -> tuple[str, list[str]] | None:
    """(table, fields) of a batch that failed on fields to add as columns (on_unknown_field = "add-column"); None for
    any other failure. The frame wrote them as JSON, so every field name reads back as it came."""
    found = _ADDED.search(error)
    return (found.group("table"), [str(name) for name in json.loads(found.group("fields"))]) if found else None


def _unparsed(table: str, fields: list[Any], parsed: Any, message: Any, spelling: Callable[[str], str | None]) -> Any:
    """Why a message routed to `table` did not parse for its schema: the first field whose JSON value is there but did
    not parse (Spark's parser keeps the fields it could read), with the value and the types; else the message as a
    whole. Evaluated only for a message that did not parse: it reads the message again, once per field."""
    from pyspark.sql import functions as F

    whole = f"not valid JSON for the schema of {table}"
    reason = F.when(F.lit(False), F.lit(None).cast("string"))
    for field in fields:
        text = _field_text(message, field.name)
        if text is None:
            continue  # the message as a whole is named
        shown = F.when(F.length(text) > _SHOWN, F.concat(F.substring(text, 1, _SHOWN), F.lit("…"))).otherwise(text)
        column = spelling(field.name)
        reason = reason.when(parsed[field.name].isNull() & text.isNotNull(), F.concat(
            F.lit(f"{whole}: field {field.name!r} holds "), shown,
            F.lit(f", which does not parse as {field.dataType.simpleString().upper()}"
                  + (f" (column type {column})" if column else ""))))
    return reason.otherwise(F.lit(whole))


#: The most characters of a value a dead letter's reason shows.
_SHOWN = 60


def _json_text(message: Any, field: Any) -> Any:
    """The field's JSON text where its parsed value cannot tell what was lost (a DECIMAL(38,s), which Spark's parser
    rounds to its scale with no place to spare), else None: read only then, as it scans the message again."""
    from pyspark.sql.types import DecimalType

    kind = field.dataType
    if not isinstance(kind, DecimalType) or _parsed_type(kind) != kind:
        return None
    return _field_text(message, field.name)


def _field_text(message: Any, name: str) -> Any:
    """The JSON text of the message's field `name` (a string unquoted; NULL when absent or null), or None when a JSON
    path cannot name the field (a name with a quote)."""
    from pyspark.sql import functions as F

    return None if "'" in name else F.get_json_object(message, f"$['{name}']")


def _parsed_type(kind: DataType) -> DataType:
    """The type a message's field is parsed as: its schema's, except that DECIMAL(p,s) is parsed with every digit
    DECIMAL(38) has left as places, since Spark's JSON parser rounds to the scale it is given: so the value checks
    see the places the column would lose (a dead letter, not a rounded value). The integer digits stay p - s, so the
    cast back to the schema's type cannot overflow."""
    from pyspark.sql.types import DecimalType

    if isinstance(kind, DecimalType) and kind.precision < _DECIMAL_DIGITS:
        return DecimalType(_DECIMAL_DIGITS, kind.scale + _DECIMAL_DIGITS - kind.precision)
    return kind


#: What Debezium's PostgreSQL connector sends for a TOASTed column an update left unchanged, unless the table has
#: REPLICA IDENTITY FULL (its `unavailable.value.placeholder`, this by default; a bytea carries the same bytes, an array
#: the placeholder as its one element).
UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
_UNAVAILABLE_REASON = (
    f"column {{column!r}} of {{table}} holds Debezium's placeholder for an unchanged TOASTed value ({UNAVAILABLE_PLACEHOLDER}),"
    " not the value: not loaded, the stored row keeps its values; set REPLICA IDENTITY FULL on the PostgreSQL table so"
    " that updates carry every column")


def _unavailable_value(value: Any, kind: Any) -> Any:
    """True where a parsed field is Debezium's unavailable-value placeholder (None: a type that cannot carry it)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(kind, T.StringType):
        return value == F.lit(UNAVAILABLE_PLACEHOLDER)
    if isinstance(kind, T.BinaryType):
        return value == F.lit(UNAVAILABLE_PLACEHOLDER.encode())
    if isinstance(kind, T.ArrayType) and isinstance(kind.elementType, (T.StringType, T.BinaryType)):
        return F.coalesce(F.array_contains(value, F.lit(UNAVAILABLE_PLACEHOLDER).cast(kind.elementType)), F.lit(False))
    return None


def _deleted_value(value: Any, kind: Any, deleted: Any) -> Any:
    """A non-key field of a change row: as parsed, except in a delete, which sets nothing but its key: there it is its
    type's zero, whether the column could hold NULL or not (StarRocks and Doris in strict mode filter a row with a NULL
    in a NOT NULL column, which would drop the delete, and their schema answers do not always say which columns are).
    PostgreSQL's default replica identity sends the key alone; a struct has no zero and stays NULL."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    zero = {T.StringType: F.lit(""), T.BinaryType: F.lit(b""), T.BooleanType: F.lit(False),
            T.DateType: F.lit(dt.date(1970, 1, 1)), T.TimestampType: F.lit(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)),
            T.TimestampNTZType: F.lit(dt.datetime(1970, 1, 1)), T.ArrayType: F.array(), T.MapType: F.create_map()}.get(type(kind))
    if zero is None and isinstance(kind, T.NumericType):
        zero = F.lit(0)
    return F.when(deleted, (F.lit(None) if zero is None else zero).cast(kind)).otherwise(value)


def _no_route(spec: JobSpec) -> Any:
    """Why a message has no table."""
    from pyspark.sql import functions as F

    if spec.topic_table:
        return F.concat(F.lit("topic "), F.col("topic"), F.lit(f" does not match routing.topic_table '{spec.topic_table}'"))
    return F.lit(f"message has no {spec.table_field!r} field" if spec.table_field else "no table for the topic")


def _unknown_table(spec: JobSpec, route: Any, unavailable: Mapping[str, str] | None) -> Any:
    """Why a message's table is not one the job loads: with `routing.topic_table`, naming the topic, the table and
    the reason found at start, or that its topic appeared after the job started."""
    from pyspark.sql import functions as F

    if not spec.topic_table:
        return F.concat(F.lit("unknown table "), route)
    later = F.lit("it was not among the tables of the topics read when the job started (a topic created since): "
                  "restart the job to load it")
    why = F.coalesce(F.create_map(*[F.lit(x) for pair in unavailable.items() for x in pair])[route], later) \
        if unavailable else later
    return F.concat(F.lit("topic "), F.col("topic"), F.lit(" maps to table "), route, F.lit(": "), why)


def _input_column(index: int) -> str:
    """The frame's column holding the input row (parsed fields and metadata) of the index-th table."""
    return f"{_INTERNAL}in{index}"


def projection_inputs(spec: JobSpec, ddl: str) -> StructType:
    """What a table's `select` reads: the message's fields (the routing field aside) and the metadata columns."""
    from pyspark.sql.types import StructType

    metadata = ", ".join([f"{name} {kind}" for _, name, kind in spec.metadata()]
                         + ([f"{OP_COLUMN} INT, {VERSION_COLUMN} BIGINT"] if spec.changes else []))
    fields = [f for f in spark_schema(ddl).fields if f.name != spec.table_field]
    return StructType(fields + (list(spark_schema(metadata).fields) if metadata else []))


def table_projections(spec: JobSpec, tables: Mapping[str, str]) -> dict[str, Projection]:
    """The checked `select` of every table that has one, in the running Spark session (`projection.py`)."""
    from pyspark.sql import SparkSession

    selects = {table: select for table, select in (spec.table_selects or {}).items() if table in tables}
    if not selects:
        return {}
    spark = SparkSession.getActiveSession()
    assert spark is not None  # the schemas' DDL is parsed by Spark too: the job has started it
    return {table: plan_projection(spark, table, select, projection_inputs(spec, tables[table]))
            for table, select in selects.items()}


def _unroutable(at: Mapping[str, Any], reason: Any, advice: str) -> Any:
    """A route no table has, naming the message by its coordinates and saying why: its writer fails the batch."""
    from pyspark.sql import functions as F

    return F.concat(
        F.lit("<bad message "), at["topic"], F.lit("/"), at["partition"].cast("string"), F.lit("@"),
        at["offset"].cast("string"), F.lit(": "), reason, F.lit(f"{advice}>"),
    )


def table_schemas(spec: JobSpec, tables: dict[str, str]) -> dict[str, pa.Schema]:
    """The Arrow schema of every table the job writes, as the sink will hand it to the target."""
    return {table: to_arrow(row) for table, row in row_schemas(spec, tables).items()}


def row_schemas(spec: JobSpec, tables: Mapping[str, str],
                projections: Mapping[str, Projection] | None = None) -> dict[str, StructType]:
    """The Spark schema of the rows of every table the job writes, the dead letters' included."""
    projections = table_projections(spec, tables) if projections is None else projections
    rows = {table: projections[table].output if table in projections else projection_inputs(spec, ddl)
            for table, ddl in tables.items()}
    if spec.dead_letter_table:
        rows[spec.dead_letter_table] = spark_schema(DEAD_LETTER_COLUMNS)
    return rows


def table_slots(spec: JobSpec, tables: Mapping[str, str]) -> TableSlots:
    """Where each table's columns ride in `build_frame`'s output: what the sink's Router reads them from."""
    return _slot_layout(row_schemas(spec, tables))[0]


def _slot_layout(rows: Mapping[str, StructType]) -> tuple[TableSlots, dict[str, DataType]]:
    """Table -> ((column, slot), ...), and each slot's type: a table's i-th column of a type in that type's i-th slot,
    so there are as many slots of a type as the table with most columns of it has. Types are told apart by their
    Spark type with every nested part nullable (what a slot holds, the same Arrow type for every table). A pure
    function of the schemas (tables and types sorted): a re-run batch has the same layout, as its checksum needs."""
    kinds = {_nullable(f.dataType).json(): _nullable(f.dataType) for row in rows.values() for f in row.fields}
    number = {kind: index for index, kind in enumerate(sorted(kinds))}
    layout: TableSlots = {}
    slots: dict[tuple[int, int], DataType] = {}
    for table in sorted(rows):
        used: Counter[str] = Counter()
        pairs = []
        for f in rows[table].fields:
            kind = _nullable(f.dataType).json()
            slots[number[kind], used[kind]] = kinds[kind]
            pairs.append((f.name, f"{_SLOT}{number[kind]}_{used[kind]}"))
            used[kind] += 1
        layout[table] = tuple(pairs)
    return layout, {f"{_SLOT}{kind}_{k}": slots[kind, k] for kind, k in sorted(slots)}


def _nullable(kind: DataType) -> DataType:
    """`kind` with every element, value and field nullable (Spark's JSON parsing makes them so anyway)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(kind, ArrayType):
        return ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, MapType):
        return MapType(_nullable(kind.keyType), _nullable(kind.valueType), True)
    if isinstance(kind, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in kind.fields])
    return kind


def spark_schema(ddl: str, key: str = "schema") -> StructType:
    """Spark DDL as a StructType; a parse error names the configuration key and Spark's own reason."""
    from pyspark.sql.types import StructType

    try:
        return cast("StructType", StructType.fromDDL(ddl))  # a field list parses to a struct
    except Exception as error:  # Spark's ParseException, raised through py4j or Spark Connect
        raise ConfigurationError(f"{key}: {ddl!r} is not Spark DDL: {spark_reason(error)}") from None


def arrow_schema(ddl: str) -> pa.Schema:
    """Spark DDL as the Arrow schema Spark hands to Python (timestamps as UTC instants)."""
    return to_arrow(spark_schema(ddl))


def to_arrow(schema: StructType) -> pa.Schema:
    """A Spark schema as the Arrow schema Spark hands to Python (timestamps as UTC instants)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    # pyspark 4.0 converts timestamps to UTC by default; 4.2 wants the zone named
    zone: dict[str, Any] = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
    return to_arrow_schema(schema, **zone)


def check_columns(target: Target, rules: ColumnRules, schemas: Mapping[str, pa.Schema]) -> dict[str, dict[str, str] | None]:
    """Every column the job writes must exist in its table, where the target can tell; returns the
    tables' column types (None where the target cannot tell) for the value checks."""
    found: dict[str, dict[str, str] | None] = {}
    for table, schema in schemas.items():
        target.check_schema(table, schema)
        existing = found[table] = target.table_columns(table)
        if existing is None:
            continue
        known = {column_key(rules, name) for name in existing}
        missing = [name for name in table_columns(schema.names) if column_key(rules, name) not in known]
        if missing:
            raise ConfigurationError(
                f"table {table!r} has no column(s) {missing} that the job writes (it has {list(existing)}); "
                f"add them to the table or remove them from tables.{table}.schema"
            )
    return found
