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


def test_errors_whose_constructor_takes_more_than_a_message_keep_their_type_and_message():
    """F7: FencedError, StateStoreLostError and the HTTP errors take several arguments; they came back as TypeError."""
    from streaming_sink.state.base import FencedError, StateStoreLostError
    from streaming_sink.targets.streamload.http import HttpConnectionError, HttpStatusError

    for kind in (FencedError, StateStoreLostError, HttpConnectionError, HttpStatusError):
        line = f"{kind.__module__}.{kind.__name__}: job 'j': epoch 3 was taken by a newer driver"
        error = sink_error_of(Exception(TRACEBACK + line + "\n"))
        assert type(error) is kind, (kind, error)
        assert str(error) == "job 'j': epoch 3 was taken by a newer driver"


def test_the_rebuilt_error_keeps_the_attributes_callers_read_as_unknown():
    """A caller reading `maybe_applied` or `current` of an error from a task must not meet an AttributeError:
    the task's values are not in the text, so they read as the safe unknowns."""
    from streaming_sink.state.base import FencedError
    from streaming_sink.targets.streamload.http import HttpConnectionError

    fenced = sink_error_of(Exception("streaming_sink.state.base.FencedError: fenced"))
    assert isinstance(fenced, FencedError) and fenced.current is None
    dropped = sink_error_of(Exception("streaming_sink.targets.streamload.http.HttpConnectionError: dropped"))
    assert isinstance(dropped, HttpConnectionError) and dropped.maybe_applied is True


def test_a_job_stopped_for_an_operator_or_fenced_is_exit_code_4_naming_the_error() -> None:
    """Never 'unexpected TypeError … a bug' (exit 5): the error keeps its type, and its code says 'refused for safety'."""
    from streaming_sink.cli import ExitCode, describe_error
    from streaming_sink.errors import SourceReplannedError
    from streaming_sink.state.base import StateStoreLostError

    for line, kind, said in (("streaming_sink.errors.SourceReplannedError: batch 3 re-planned", SourceReplannedError,
                              "stopped for an operator (SourceReplannedError): batch 3 re-planned"),
                             ("streaming_sink.state.base.StateStoreLostError: job 'j': the store lost state",
                              StateStoreLostError, "refusing: job 'j': the store lost state")):
        error = sink_error_of(Exception(line))
        assert type(error) is kind
        assert describe_error(error) == (ExitCode.REFUSED, said)
