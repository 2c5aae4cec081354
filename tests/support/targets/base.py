"""What every target adapter is: how the end-to-end pipeline reaches the target (`tests.support.pipeline`: its URL,
options, credentials, tables, rows, leftovers) and how the crash matrix drives it (tests/integration/
test_exactly_once_matrix.py: the matrix's knobs, its transactions by state, restarts, the final check).

A target's adapter is one subclass in `tests/support/targets/<product>.py`; a new target joins the matrix with that
class and one line in its `TARGETS`, and its own scenarios take the same class (`target = pytest.fixture(X.for_test)`).
"""
from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from streaming_sink.labels import parse_label
from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from tests.support.crash import assert_stopped_at, hooked_driver_settings
from tests.support.pipeline import DB, TABLES, LocalPipeline

__all__ = ["ABORTED", "COLUMNS", "COMMITTED", "OPEN", "EmulatorAdapter", "TargetAdapter", "label_batch", "label_parts"]

#: The job id of every pipeline the tests run (LocalPipeline's default): its labels start with it.
PIPELINE_JOB = LocalPipeline.job_id


def label_parts(label: str) -> dict[str, str] | None:
    """The parts of a label of the pipeline's job as text (query, batch, table, partition, epoch, write_pass, task,
    chunk), read by `streaming_sink.labels.parse_label`; None for another job's label."""
    parts = parse_label(label, PIPELINE_JOB)
    if parts is None:
        return None
    return {"query": parts.query, "batch": str(parts.batch_id), "table": parts.table, "partition": str(parts.partition),
            "epoch": str(parts.attempt.epoch), "write_pass": str(parts.attempt.write_pass),
            "task": str(parts.attempt.task), "chunk": str(parts.chunk)}


OPEN, COMMITTED, ABORTED = "open", "committed", "aborted"  # a transaction's state, as the matrix compares it
COLUMNS = [("id", "BIGINT"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"),
           ("kafka_offset", "BIGINT")]

Self = TypeVar("Self", bound="TargetAdapter")


def label_batch(label: str) -> int:
    """The batch a label of the pipeline's job belongs to (a twin's label keeps the readable prefix)."""
    found = parse_label(label, PIPELINE_JOB)
    assert found, f"not a label of the pipeline's job: {label}"
    return found.batch_id


class TargetAdapter:
    """One target as the pipeline reaches it and the crash matrix drives it; subclasses say how.

    Pipeline side (called outside the driver process): `target_url`, `target_options` (the instance's `options` over
    the class's `defaults`), `env`, `create_tables`, `rows`, `problems`.

    Crash-matrix side: the class attributes are the matrix's parameters for this target: the stores its
    protocol-point chain runs on, its default random-kill seed (`kill_seeds`) and store, and how many driver runs
    and how long a wait the random kills take (sized to its batches); `pipeline_defaults` are its pipeline's sizes
    and Spark conf; `hooked_module` runs the driver child with that module's `HOOKED` descriptor registered (the target's
    transactions obey the task hooks of tests/support/crash.py)."""

    name: ClassVar[str]
    chain_stores: ClassVar[tuple[str, ...]] = ("redis",)
    default_seed: ClassVar[str] = "23"
    random_kill_store: ClassVar[str] = "redis"
    random_kill_runs: ClassVar[int] = 3
    random_kill_wait_s: ClassVar[float] = 3.0
    chain_options: ClassVar[dict[str, Any]] = {}  # target options for the protocol-point chain
    commits_in_parallel: ClassVar[bool] = False  # "after-first-commit" may find more than one commit done
    pipeline_class: ClassVar[type[LocalPipeline]] = LocalPipeline
    pipeline_defaults: ClassVar[dict[str, Any]] = {}
    hooked_module: ClassVar[str | None] = None  # the module whose `HOOKED` descriptor the driver child registers
    defaults: ClassVar[dict[str, Any]] = {}  # target options under the instance's
    options: dict[str, Any]

    # -- the pipeline's side -----------------------------------------------------------------------------------------

    def target_url(self) -> str:
        """The job spec's `target_url`."""
        raise NotImplementedError

    def target_options(self) -> dict[str, Any]:
        """The job spec's `target_options`."""
        return {**self.defaults, **self.options}

    def env(self) -> dict[str, str]:
        """Extra environment for the driver (e.g. credentials)."""
        return {}

    def create_tables(self, database: str, tables: list[str]) -> None:
        """Tables with columns id, name, amount, kafka_partition, kafka_offset."""
        raise NotImplementedError

    def rows(self, database: str, table: str) -> list[tuple]:
        """Visible rows as sorted (id, name, amount, kafka_partition, kafka_offset) tuples."""
        raise NotImplementedError

    def problems(self, database: str) -> list[str]:
        """Anything left behind or inconsistent in the target (empty when clean)."""
        return []

    # -- the crash matrix's side -------------------------------------------------------------------------------------

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator[Any]:
        """The target running for one test (an emulator or a front in this process, or nothing to start)."""
        raise NotImplementedError
        yield

    @classmethod
    def for_test(cls, tmp_path: Path) -> Iterator[Any]:
        """`started`, as a pytest fixture takes it: `target = pytest.fixture(SomeAdapter.for_test)`."""
        with cls.started(tmp_path) as running:
            yield running

    def with_options(self: Self, options: dict[str, Any]) -> Self:
        """This adapter with further target options (a copy: the running target is shared)."""
        configured = copy.copy(self)
        configured.options = {**self.options, **options}
        return configured

    def for_pipeline(self, root: Path, options: dict[str, Any]) -> TargetAdapter:
        """The adapter a pipeline under `root` takes, with `options`."""
        return self.with_options(options)

    def pipeline_settings(self, root: Path, options: dict[str, Any]) -> dict[str, Any]:
        """`LocalPipeline` arguments for this target (adapter with `options`, sizes, Spark conf, driver module)."""
        hooked = hooked_driver_settings(self.hooked_module) if self.hooked_module else {}
        return {**copy.deepcopy(self.pipeline_defaults), **hooked, "adapter": self.for_pipeline(root, options)}

    def pipeline(self, root: Path, broker: Any, state_url: str, options: dict[str, Any] | None = None,
                 spark_conf: dict[str, str] | None = None, **overrides: Any) -> LocalPipeline:
        """A pipeline into this target with its messages produced: `options` are target options, `spark_conf` and
        `driver_env` add to the target's, `overrides` replace its other `LocalPipeline` arguments."""
        settings = self.pipeline_settings(root, options or {})
        settings["spark_conf"] = {**settings.get("spark_conf", {}), **(spark_conf or {})}
        settings["driver_env"] = {**settings.get("driver_env", {}), **overrides.pop("driver_env", {})}
        pipeline = self.pipeline_class(root, broker, state_url, **{**settings, **overrides})
        pipeline.produce()
        return pipeline

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """The batch's transactions the target knows: label -> OPEN (prepared), COMMITTED or ABORTED."""
        raise NotImplementedError

    def assert_stopped_at(self, pipeline: LocalPipeline, point: str, batch: int) -> None:
        """The journal shows the step (`crash.assert_stopped_at`), and the target agrees with it label by label."""
        assert_stopped_at(pipeline, point, batch, commits_in_parallel=self.commits_in_parallel)
        record, intents, done = pipeline.batch_state(batch)
        found = self.transactions(pipeline, batch)
        if point == "after-writers-prepared":
            assert found == {ref.label: OPEN for ref in intents}, f"every intent, and only they, should be open: {found}"
        elif point == "after-first-commit":
            assert set(found) == {c.label for c in record.committables} and set(found.values()) <= {OPEN, COMMITTED}
            committed = {label for label, state in found.items() if state == COMMITTED}
            assert done <= committed and (self.commits_in_parallel or committed == done), (done, found)
        else:
            state = OPEN if point == "after-prepared-record" else COMMITTED
            assert found == {c.label: state for c in record.committables}, f"every committable should be {state}: {found}"

    def restart(self) -> None:
        """Restart the target while the driver is down (durable state kept); nothing to do for embedded ones."""

    def verify(self, pipeline: LocalPipeline) -> None:
        """The target equals the source row by row and nothing is left anywhere (subclasses add checks)."""
        pipeline.verify()


class EmulatorAdapter(TargetAdapter):
    """A Stream Load emulator (StarRocks, Doris) running in this process: the driver reaches it over HTTP with the
    emulator's credentials, the test reads it directly."""

    defaults: ClassVar[dict[str, Any]] = {"backoff_s": 0.05}
    settled: ClassVar[tuple[str, ...]] = ("COMMITTED", "VISIBLE", "ABORTED")  # states a finished job may leave

    def __init__(self, emulator: Any, options: dict[str, Any] | None = None) -> None:
        self.emulator = emulator
        self.options = dict(options or {})

    @classmethod
    def new_emulator(cls, root: Path) -> Any:
        """The emulator, not started, with its data under `root`."""
        raise NotImplementedError

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator[Any]:
        with cls.new_emulator(root) as emulator:
            yield cls(emulator)

    def target_url(self) -> str:
        return f"{self.emulator.PRODUCT}://127.0.0.1:{self.emulator.fe_port}"

    def target_options(self) -> dict[str, Any]:
        return {"tables": TABLES, **self.defaults, **self.options}

    def env(self) -> dict[str, str]:
        return {USER_ENV: self.emulator.user, PASSWORD_ENV: self.emulator.password}

    def create_tables(self, database: str, tables: list[str]) -> None:
        for table in tables:
            self.emulator.create_table(database, table, COLUMNS)

    def rows(self, database: str, table: str) -> list[tuple]:
        return sorted(tuple(row) for row in self.emulator.visible_rows(database, table))

    def problems(self, database: str) -> list[str]:
        """Transactions left unsettled, and labels with more than one committed transaction."""
        txns = self.emulator.transactions(database)
        found = [f"txn {t['txn_id']} ({t['label']}) left {t['state']}" for t in txns if t["state"] not in self.settled]
        committed = Counter(t["label"] for t in txns if t["state"] in ("COMMITTED", "VISIBLE"))
        return found + [f"label {label} committed {n} times" for label, n in committed.items() if n > 1]

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """Each label is begun once in the matrix's runs (asserted), so a label's state is its one transaction's."""
        states = {"COMMITTED": COMMITTED, "VISIBLE": COMMITTED, "ABORTED": ABORTED}
        txns = [t for t in self.emulator.transactions(DB) if label_batch(t["label"]) == batch]
        found = {t["label"]: states.get(t["state"], OPEN) for t in txns}
        assert len(found) == len(txns), f"a label of batch {batch} was begun twice: {txns}"
        return found

    def restart(self) -> None:
        self.emulator.restart()  # FE and BE: memory lost, prepared transactions kept on disk
