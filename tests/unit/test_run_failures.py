"""`streaming-sink run` ends in one line and a documented exit code whatever stops it: the sink's own errors, a
streaming query Spark stopped for a reason of its own, or a bug; never a traceback (issue 25, item 1)."""
from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from streaming_sink import cli, job
from streaming_sink.errors import ExitCode, SourceReplannedError


def run_failing_with(error: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                     *extra: str) -> tuple[int, str]:
    def fail(*_: object, **__: object) -> int:
        raise error

    monkeypatch.setattr(job, "execute", fail)
    code = cli.main(["run", "--config", "job.toml", *extra])
    return code, capsys.readouterr().err


def test_a_query_spark_stopped_is_one_line_with_its_cause(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    failure = StreamingQueryException(message="[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
                                              "Timeout of 60000ms expired before the position for partition t-0 could "
                                              "be determined\n\tat org.apache.kafka...\n== Streaming Query ==")
    code, err = run_failing_with(failure, monkeypatch, capsys)
    assert code == ExitCode.SERVICE
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("streaming-sink run: the streaming query stopped: [STREAM_FAILED]"), err
    assert "could be determined;" in err and "org.apache.kafka" not in err, err


def test_a_bug_is_one_line_and_debug_adds_the_traceback(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_failing_with(RuntimeError("boom"), monkeypatch, capsys)
    assert (code, err) == (ExitCode.INTERNAL, "streaming-sink run: unexpected RuntimeError: boom; rerun with --debug "
                                              "and report the traceback\n")
    code, err = run_failing_with(RuntimeError("boom"), monkeypatch, capsys, "--debug")
    assert code == ExitCode.INTERNAL and "Traceback" in err


def test_the_sinks_own_stop_keeps_its_code_and_runbook_section(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_failing_with(SourceReplannedError("batch 3 was replanned. " + SourceReplannedError.RUNBOOK),
                                 monkeypatch, capsys)
    assert code == SourceReplannedError.exit_code and err.count("\n") == 1 and "docs/runbook.md" in err, err
