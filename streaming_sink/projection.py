"""A table's `select` (job.toml `[tables.<name>] select = "id, upper(name) AS name"`): a Spark SQL projection over
the message's parsed fields and the Kafka metadata columns, whose output is the columns the table gets.

Checked once when Spark starts (`plan_projection`), before any data moves: it parses, names only known columns,
gives one row per message (no aggregate, generator or window), names each output column once, and gives the same
value whenever a batch is read again (no `rand()`, `uuid()`, `current_timestamp()`...: a re-run batch must carry
the same rows, or its replay checksum fails). In the frame (`projected`), each output column is evaluated inside
Catalyst's TryEval, so a row whose projection fails at run time (Spark is ANSI: a bad cast raises) is told apart
from a NULL it computed, and becomes a dead letter naming the column instead of failing the batch. TryEval has no
SQL name, so it is reached through the JVM: the packaged job runs classic PySpark, never Spark Connect.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import StructType

#: Columns of the frame's own between its stages: a select may not name or produce them.
INTERNAL_PREFIX = "__streaming_sink_"
#: Catalyst expressions Spark calls deterministic that still differ between two reads of one batch.
_VARYING = {"CurrentTimestamp", "Now", "CurrentDate", "LocalTimestamp", "CurrentTimeZone", "CurrentBatchTimestamp",
            "CurrentTime", "CallMethodViaReflection", "TryReflect"}
_PAIRS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class Projection:
    """One table's checked select: its items, one per output column (a bare `*` spelled out), and those columns."""

    table: str
    items: tuple[str, ...]
    output: StructType

    @property
    def key(self) -> str:
        return f"tables.{self.table}.select"


def split_items(select: str) -> list[str]:
    """The select list's items, split at the commas outside brackets and quotes (Spark parses each item)."""
    items, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(select):
        char = select[i]
        if quote:
            if char == "\\" and quote != "`":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"`":
            quote = char
        elif char in _PAIRS:
            depth += 1
        elif char in _PAIRS.values():
            depth -= 1
        elif char == "," and depth == 0:
            items.append(select[start:i])
            start = i + 1
        i += 1
    items.append(select[start:])
    return [item.strip() for item in items]


def plan_projection(spark: SparkSession, table: str, select: str, inputs: StructType) -> Projection:
    """The checked projection of `select` over `inputs` (the table's parsed fields and metadata columns)."""
    key = f"tables.{table}.select"
    items = split_items(select)
    if not all(items):
        raise ConfigurationError(f"{key}: {select!r} has an empty column; give e.g. \"id, upper(name) AS name\"")
    every = [f"`{name}`" for name in inputs.names]
    items = [part for item in items for part in (every if item == "*" else [item])]
    source = spark.createDataFrame([], inputs)
    try:
        result = source.selectExpr(*items)
    except Exception as error:  # Spark's ParseException or AnalysisException, raised through py4j
        raise ConfigurationError(f"{key}: {select!r}: {spark_reason(error)}") from None
    plan = result._jdf.queryExecution().analyzed()
    source_node = source._jdf.queryExecution().analyzed().getClass().getSimpleName()
    if plan.getClass().getSimpleName() != "Project" or plan.child().getClass().getSimpleName() != source_node:
        raise ConfigurationError(f"{key}: {select!r} must give one row per message: no aggregate, generator "
                                 "(explode) or window function")
    names = result.schema.names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError(f"{key}: {select!r} names column(s) {twice} more than once")
    inner = [name for name in names if name.startswith(INTERNAL_PREFIX)]
    if inner:
        raise ConfigurationError(f"{key}: {select!r}: {inner} start with {INTERNAL_PREFIX!r}, which the job keeps for itself")
    project_list = plan.projectList()
    for index in range(project_list.size()):
        varying = _varying(project_list.apply(index))
        if varying:
            raise ConfigurationError(
                f"{key}: column {names[index]!r} uses {varying}, which gives another value when a batch is read again "
                "(after a crash, or a replay); exactly-once needs the same rows each time: compute it from the message "
                "or its Kafka metadata (kafka_timestamp) instead")
    projection = Projection(table, tuple(items), result.schema)
    try:  # row by row through Catalyst's TryEval, reached by internal names: this Spark must have them
        _ = source.select(*[tried for _, tried in projected(projection)]).schema  # analysed, not run
    except Exception as error:  # noqa: BLE001 - py4j's TypeError for a missing class, or Spark's own
        raise ConfigurationError(f"{key}: this Spark ({spark.version}) cannot evaluate a select row by row "
                                 f"({spark_reason(error)}); the job is tested with the pyspark of constraints.txt") from None
    return projection


def _varying(node: Any) -> str | None:
    """The innermost part of a Catalyst expression that is not the same on every read (`rand()`); None if none."""
    children = node.children()
    for index in range(children.size()):
        found = _varying(children.apply(index))
        if found:
            return found
    if not node.deterministic() or node.getClass().getSimpleName() in _VARYING:
        return f"{node.prettyName()}()"
    return None


def spark_reason(error: BaseException) -> str:
    """The first line of Spark's message (a ParseException's starts with an empty one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def projected(projection: Projection) -> list[tuple[str, Column]]:
    """(output column, a struct column `v` holding its value) per output column, each evaluated inside TryEval: the
    struct is NULL where the value could not be computed. Over a frame where the table's inputs are top-level columns."""
    from pyspark.sql import functions as F

    return [(name, _try_eval(F.struct(F.expr(item).alias("v"))))
            for name, item in zip(projection.output.names, projection.items, strict=True)]


def _try_eval(column: Column) -> Column:
    """`column` evaluated so that an error gives NULL (Catalyst's TryEval, as Spark's own try_* functions)."""
    from pyspark.sql import Column as PyColumn
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    jvm = spark._jvm if spark is not None else None
    assert jvm is not None  # the frame is built in a running classic session
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    wrapped = jvm.org.apache.spark.sql.catalyst.expressions.TryEval(utils.expression(column._jc))
    return PyColumn(utils.column(wrapped))
