"""One adapter per target for the shared crash matrix (tests/integration/test_exactly_once_matrix.py).

A `CrashTarget` starts a target (or its emulator) for one test, builds the end-to-end pipeline
that drives it (`devstack.pipeline.LocalPipeline`: the job's configuration, the driver to run,
the target's rows), and tells the matrix what only the target can see: a batch's transactions, open,
committed or aborted. A new target needs one subclass here (or beside its harness) and one line in
the matrix's `TARGETS`; its own scenarios use the same subclass (`pytest.fixture(X.for_test)`).
"""
from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator

from devstack.pipeline import DB, TABLES, ClickHouseAdapter, LocalPipeline, open_target
from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from streaming_sink.targets.clickhouse import COMMITTED as LEDGER_COMMITTED, LEDGER_TABLE, ClickHouseTarget
from tests.emulators.base_emulator import BaseEmulator
from tests.integration.exactly_once import assert_stopped_at

# The readable part of a label (streaming_sink.committable.make_label) of the pipeline's job:
# query id prefix, batch, table, partition, attempt (epoch, write pass, task attempt), chunk.
LABEL = re.compile(
    r"^ss_orders_ingest_(?P<query>[0-9a-f]{8})_(?P<batch>\d+)_(?P<table>" + "|".join(TABLES) + r")_p(?P<partition>\d+)"
    r"_e(?P<epoch>\d+)w(?P<write_pass>\d+)t(?P<task>\d+)_c(?P<chunk>\d+)_[0-9a-f]{12}$"
)
OPEN, COMMITTED, ABORTED = "open", "committed", "aborted"  # a transaction's state, as the matrix compares it
COLUMNS = [("id", "BIGINT"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"),
           ("kafka_offset", "BIGINT")]


def label_batch(label: str) -> int:
    """The batch a label of the pipeline's job belongs to (a twin's label keeps the readable prefix)."""
    found = re.match(r"^ss_orders_ingest_[0-9a-f]{8}_(\d+)_", label)
    assert found, f"not a label of the pipeline's job: {label}"
    return int(found.group(1))


class CrashTarget:
    """A target as the crash matrix drives it; subclasses set the knobs and say how to read it.

    The class attributes are the matrix's parameters for this target: the stores its protocol-point
    chain runs on, its default random-kill seed (`kill_seeds`) and store, and how many driver runs
    and how long a wait the random kills take (sized to its batches)."""

    name: ClassVar[str]
    chain_stores: ClassVar[tuple[str, ...]] = ("redis",)
    default_seed: ClassVar[str] = "23"
    random_kill_store: ClassVar[str] = "redis"
    random_kill_runs: ClassVar[int] = 3
    random_kill_wait_s: ClassVar[float] = 3.0
    chain_options: ClassVar[dict[str, Any]] = {}  # target options for the protocol-point chain
    commits_in_parallel: ClassVar[bool] = False  # "after-first-commit" may find more than one commit done

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator["CrashTarget"]:
        """The target running for one test (an emulator in this process, or nothing to start)."""
        yield cls()

    @classmethod
    def for_test(cls, tmp_path: Path) -> Iterator["CrashTarget"]:
        """`started`, as a pytest fixture takes it: `target = pytest.fixture(SomeCrashTarget.for_test)`."""
        with cls.started(tmp_path) as running:
            yield running

    pipeline_class: ClassVar[type[LocalPipeline]] = LocalPipeline

    def pipeline(self, root: Path, broker: Any, state_url: str, options: dict[str, Any] | None = None,
                 spark_conf: dict[str, str] | None = None, **overrides: Any) -> LocalPipeline:
        """A pipeline into this target with its messages produced: `options` are target options,
        `spark_conf` adds to the target's, `overrides` replace its other `LocalPipeline` arguments."""
        settings = self.pipeline_settings(options or {})
        settings["spark_conf"] = {**settings.get("spark_conf", {}), **(spark_conf or {})}
        pipeline = self.pipeline_class(root, broker, state_url, **{**settings, **overrides})
        pipeline.produce()
        return pipeline

    def pipeline_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        """`LocalPipeline` arguments for this target (adapter with `options`, sizes, Spark conf, driver module)."""
        raise NotImplementedError

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """The batch's transactions the target knows: label -> OPEN (prepared), COMMITTED or ABORTED."""
        raise NotImplementedError

    def assert_stopped_at(self, pipeline: LocalPipeline, point: str, batch: int) -> None:
        """The journal shows the step (`exactly_once.assert_stopped_at`), and the target agrees with it label by label."""
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


class ClickHouseCrashTarget(CrashTarget):
    """Embedded ClickHouse (chdb), the pipeline's default; prepared parts are staging tables named by label."""

    name = "clickhouse"
    chain_stores = ("file", "redis")

    def pipeline_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        assert not options, "the chdb pipeline takes the target's defaults"
        return {}

    @contextmanager
    def reader(self, pipeline: LocalPipeline) -> Iterator[ClickHouseTarget]:
        """A client for reading, closed afterwards so that the next driver can open the chdb path."""
        assert isinstance(pipeline.adapter, ClickHouseAdapter)
        with open_target(pipeline.adapter.path, DB) as target:
            yield target

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """Staging tables are open; the commit ledger names the committed (an aborted label leaves no trace)."""
        with self.reader(pipeline) as target:
            found = {name: OPEN for name in target.staging_tables()}
            ledger = target.client().query(f"SELECT label, state FROM {DB}.{LEDGER_TABLE}").result_rows
        found.update({label: COMMITTED for label, state in ledger if state == LEDGER_COMMITTED})
        return {label: state for label, state in found.items() if label_batch(label) == batch}


@dataclass
class EmulatorAdapter:
    """How devstack.pipeline reaches a Stream Load emulator in this process (its TargetAdapter): the driver
    over HTTP with the emulator's credentials, the test by reading the emulator directly."""

    emulator: BaseEmulator
    options: dict[str, Any] = field(default_factory=dict)
    defaults: ClassVar[dict[str, Any]] = {"backoff_s": 0.05}  # target options under the test's
    settled: ClassVar[tuple[str, ...]] = ("COMMITTED", "VISIBLE", "ABORTED")  # states a finished job may leave

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


class EmulatorCrashTarget(CrashTarget):
    """A Stream Load emulator (StarRocks, Doris) running in this process for the test."""

    def __init__(self, emulator: BaseEmulator) -> None:
        self.emulator = emulator

    @classmethod
    def new_emulator(cls, root: Path) -> BaseEmulator:
        """The emulator, not started, with its data under `root`."""
        raise NotImplementedError

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator["CrashTarget"]:
        with cls.new_emulator(root) as emulator:
            yield cls(emulator)

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """Each label is begun once in the matrix's runs (asserted), so a label's state is its one transaction's."""
        states = {"COMMITTED": COMMITTED, "VISIBLE": COMMITTED, "ABORTED": ABORTED}
        txns = [t for t in self.emulator.transactions(DB) if label_batch(t["label"]) == batch]
        found = {t["label"]: states.get(t["state"], OPEN) for t in txns}
        assert len(found) == len(txns), f"a label of batch {batch} was begun twice: {txns}"
        return found

    def restart(self) -> None:
        self.emulator.restart()  # FE and BE: memory lost, prepared transactions kept on disk
