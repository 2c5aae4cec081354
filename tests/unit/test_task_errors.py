"""The sink's own errors raised in Spark tasks reach the driver as text; `sink_error_of` gives them back their type."""
from __future__ import annotations

from streaming_sink.errors import ConfigurationError, ReplayLostAgainError
from streaming_sink.execution import sink_error_of
from streaming_sink.routing import UnknownTableError

TRACEBACK = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/x/streaming_sink/writer.py", line 10, in add_all
    self.router.route(batch)
streaming_sink.errors.ConfigurationError: an earlier error, handled

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/streaming_sink/routing.py", line 56, in route
    raise UnknownTableError(
streaming_sink.routing.UnknownTableError: rows route to unknown table(s) ['refunds'] by column 'table'
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)
"""


def test_the_last_error_of_the_traceback_comes_back_as_its_type_with_its_line():
    error = sink_error_of(Exception(TRACEBACK))
    assert type(error) is UnknownTableError
    assert str(error) == "rows route to unknown table(s) ['refunds'] by column 'table'"


def test_a_subclass_anywhere_in_the_tree_keeps_its_type():
    error = sink_error_of(Exception("streaming_sink.errors.ReplayLostAgainError: lost twice"))
    assert type(error) is ReplayLostAgainError and isinstance(error, Exception)
    assert not isinstance(error, ConfigurationError)


def test_anything_else_stays_what_spark_raised():
    assert sink_error_of(Exception("ValueError: not ours")) is None
    assert sink_error_of(Exception("streaming_sink.writer.PartitionWriter: a class, not an error")) is None
    assert sink_error_of(Exception("streaming_sink.nowhere.Missing: no such module")) is None
    assert sink_error_of(Exception("pyarrow.lib.ArrowInvalid: streaming_sink.errors.ConfigurationError: quoted")) is None
