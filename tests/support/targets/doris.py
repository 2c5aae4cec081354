"""Doris in the tests: the emulator with faults aimed by label pattern, a flush per Arrow batch, and `DorisAdapter`,
the one adapter of the pipeline and the crash matrix.

The emulator (tests/support/doubles/emulators/doris.py) runs in the pytest process, so a test can move its clock
while the driver is down, restart it, and arm faults. Every Arrow batch is its own flush here (flush_bytes=1, small
Arrow batches), so each (table, partition) of a batch streams many flushes into the body of its one transaction,
as a large partition would in production.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.faults import Call
from tests.support.doubles.emulators.http_server import Response
from tests.support.pipeline import DB, LocalPipeline
from tests.support.targets.base import EmulatorAdapter, label_batch, label_parts

__all__ = ["PASSWORD", "USER", "DorisAdapter", "DorisPipeline", "Rule", "ScriptedDoris", "batch_txns"]

USER, PASSWORD = "loader", "s3cret"  # not the default: proves credentials survive the FE -> BE 307


@dataclass
class Rule:
    """Fail (HTTP 503) or expire requests whose op and label parts match; at most `times` of them. "fail_at_end": a
    load that fails once its whole body was read (its transaction aborted, as a load whose rows the BE rejects)."""

    action: str  # "fail" | "expire" | "fail_at_end"
    op: str
    parts: dict[str, str]
    times: int = 1_000_000
    fired: int = 0

    def matches(self, call: Call) -> bool:
        if self.fired >= self.times or call.op != self.op or call.label is None:
            return False
        found = label_parts(call.label)
        return found is not None and all(found[k] == v for k, v in self.parts.items())


class ScriptedDoris(DorisEmulator):
    """The Doris emulator plus faults aimed at a label pattern (the generic knobs need exact labels,
    which embed the query id and the driver's fencing epoch, unknown before the job starts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rules: list[Rule] = []

    def route(self, role: str, req: Any, call: Call) -> Response:
        for rule in self.rules:
            if role == "be" and rule.action == "fail_at_end" and rule.matches(call):
                rule.fired += 1
                super().route(role, req, call)  # the whole body read, the transaction begun
                with self.lock:
                    self._expire_label(call.db, call.label)
                return self._load_json(call.label or "", True, "Fail", "emulated failure at the load's end (scripted)")
            if role == "fe" and rule.action != "fail_at_end" and rule.matches(call):
                rule.fired += 1
                if rule.action == "fail":
                    return Response.text("emulated HTTP 503 (scripted)", status=503)
                with self.lock:
                    self._expire_label(call.db, call.label)
        return super().route(role, req, call)


@dataclass
class DorisPipeline(LocalPipeline):
    """LocalPipeline with a flush per Arrow batch: every (table, partition) streams many flushes into one load."""

    flush_bytes: int = 1

    def write_spec(self) -> None:
        super().write_spec()
        spec = json.loads(self.spec_path.read_text())
        spec["flush_bytes"] = self.flush_bytes
        self.spec_path.write_text(json.dumps(spec))

    @property
    def emu(self) -> ScriptedDoris:
        assert isinstance(self.adapter, DorisAdapter)
        return self.adapter.emulator

    def records(self) -> dict[int, Any]:
        store = self.store()
        return {key[1]: store.get_batch(self.job_id, *key) for key in store.batch_keys(self.job_id)}

    def verify_all(self) -> None:
        """`LocalPipeline.verify`, then the emulator's transactions against the state store's records."""
        self.verify()
        live = Counter(c.label for r in self.records().values() for c in r.live_committables())
        assert all(n == 1 for n in live.values()), f"a label is live in two batch records: {live.most_common(3)}"
        visible = {t["label"]: t for t in self.emu.transactions(DB) if t["state"] == "VISIBLE"}
        assert set(visible) == set(live), (
            f"visible but in no record: {sorted(set(visible) - set(live))[:5]}; "
            f"recorded but not visible: {sorted(set(live) - set(visible))[:5]}"
        )
        assert sum(t["rows"] for t in visible.values()) == sum(len(v) for v in self.source.values())


def batch_txns(emu: DorisEmulator, batch: int) -> list[dict[str, Any]]:
    return [t for t in emu.transactions(DB) if label_batch(t["label"]) == batch]


class DorisAdapter(EmulatorAdapter):
    """The scripted Doris emulator; the driver reaches it over HTTP, the test reads it directly. A finished job leaves
    nothing COMMITTED and not yet VISIBLE. In the matrix: 4 batches of 40 messages per partition, several flushes
    streamed into each (table, partition)'s one transaction, commits in parallel."""

    name = "doris"
    default_seed = "29"
    random_kill_store = "file"
    random_kill_runs = 2
    random_kill_wait_s = 2.5
    commits_in_parallel = True
    settled = ("VISIBLE", "ABORTED")
    pipeline_class = DorisPipeline
    pipeline_defaults = {"messages_per_partition": 160, "max_offsets_per_trigger": 120,  # 4 batches of 40 per partition
                         "spark_conf": {"spark.sql.execution.arrow.maxRecordsPerBatch": "20"}}
    emulator: ScriptedDoris

    @classmethod
    def new_emulator(cls, root: Path) -> ScriptedDoris:
        return ScriptedDoris(root / "doris", user=USER, password=PASSWORD)

    def verify(self, pipeline: LocalPipeline) -> None:
        assert isinstance(pipeline, DorisPipeline)
        pipeline.verify_all()
