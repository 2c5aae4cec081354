"""`streaming-sink doctor` gives a verdict per check, and fails the ones that are wrong."""
from __future__ import annotations

import json
import subprocess
import sys

from streaming_sink.batch_plan import BatchPlan
from streaming_sink.committable import Committable
from streaming_sink.doctor import budget, expiry_checks, largest_wave, render
from streaming_sink.labels import wave_partition
from streaming_sink.records import BatchRecord, BatchState
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.jobs import write_job_toml
from tests.support.pipeline import open_target

DB = "analytics"


def write_config(tmp_path, bootstrap: str, topic: str) -> str:
    return str(write_job_toml(tmp_path, job_id="doc", kafka={"bootstrap_servers": bootstrap, "topics": [topic]},
                              target={"url": f"chdb://{tmp_path / 'ch'}", "database": DB},
                              state={"url": f"file://{tmp_path / 'state'}"}))


def doctor(config: str, tolerance: str) -> tuple[int, dict[str, dict]]:
    proc = subprocess.run([sys.executable, "-m", "streaming_sink.cli", "doctor", "--config", config,
                           "--outage-tolerance", tolerance, "--json"], capture_output=True, text=True, timeout=180)
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)}


def test_a_label_count_limit_is_a_warning_and_age_limits_are_judged_against_the_outage():
    """Doris forgets a label after 12 h or 2000 newer finished loads: the count cannot be compared with an
    outage, so doctor warns about it (with the setting to raise) and judges only the age."""
    six_hours = {c.name: c for c in expiry_checks(DorisTarget().expiry_limits(), 6 * 3600)}
    precommit = six_hours["timeout pre-committed transactions (FE default)"]
    assert precommit.verdict == "FAIL" and "3600 s is shorter than the planned outage tolerance 21600 s" in precommit.detail
    label = six_hours["timeout label history (FE default)"]
    assert label.verdict == "WARN" and label.detail.startswith("43200 s >= the planned outage tolerance 21600 s, but")
    assert "2000 newer transactions" in label.detail and "label_num_threshold" in label.detail
    assert "verdict: FAIL (1 of 2 checks failed)" in render(list(six_hours.values()))  # a warning does not fail

    one_day = {c.name: c for c in expiry_checks(DorisTarget().expiry_limits(), 86400)}["timeout label history (FE default)"]
    assert one_day.verdict == "FAIL" and "2000 newer transactions" in one_day.detail

    starrocks = {c.name: c for c in expiry_checks(StarRocksTarget().expiry_limits(), 6 * 3600)}
    assert starrocks["timeout prepared transactions"].verdict == "OK"
    label = starrocks["timeout label history (FE default)"]
    assert label.verdict == "WARN" and "1000 newer transactions" in label.detail and "label_keep_max_num" in label.detail


def test_the_label_history_the_job_can_rely_on_counts_its_largest_batch():
    """StarRocks keeps the newest 1000 transactions of a database, running ones included: a batch of 300 leaves room
    for 700 others to finish before its labels are forgotten; a batch of 1200 forgets its own labels as it commits."""
    limits = StarRocksTarget().expiry_limits()
    fits = {c.name: c for c in expiry_checks(limits, 3600, largest_batch=300)}["timeout label history (FE default)"]
    assert fits.verdict == "WARN" and "largest batch so far held 300 transactions" in fits.detail
    assert "while fewer than 700 other transactions finish in the database" in fits.detail
    larger = {c.name: c for c in expiry_checks(limits, 3600, largest_batch=1200)}["timeout label history (FE default)"]
    assert larger.verdict == "FAIL" and "more than the server remembers" in larger.detail
    assert "section 'Replay ambiguous: a committed label was forgotten'" in larger.detail


def test_the_budget_says_the_limits_assumed_their_source_the_share_and_the_largest_batch():
    """A StarRocks FE whose release is not read: the least default of any release (100 running, 1000 labels), waves
    of 50; a Doris FE configured otherwise says so. The largest batch is read from the journal: its tables,
    transactions and waves. (The release read from the FE: test_transaction_limits.py.)"""
    assert budget(StarRocksTarget(), []) == (
        "the server allows 100 running transactions and remembers 1000 labels per database (StarRocks: "
        "max_running_txn_num_per_db 100 (the FE's release is not read yet: the least release default; set the option "
        "to the server's value); label_keep_max_num 1000 (release default)); a batch holds at most 50 at once "
        "(share 0.5), more commit in waves; no batch recorded yet")
    doris = budget(DorisTarget(max_running_txn_num_per_db=1000, label_num_threshold=-1), [])
    assert "allows 1000 running transactions and remembers unlimited labels" in doris, doris
    assert "max_running_txn_num_per_db 1000 (configured); label_num_threshold unlimited (configured)" in doris
    assert "at most 500 at once" in doris
    tables = [f"t{n}" for n in range(300)]
    plan = BatchPlan({t: 4 for t in tables}, (tuple(tables[:125]), tuple(tables[125:250]), tuple(tables[250:])),
                     budget=500)
    committables = [Committable("starrocks", "db", t, f"L{t}{w}", wave_partition(plan.wave_of(t), w), "e1w0t1")
                    for t in tables for w in range(4)]
    record = BatchRecord("q", 7, BatchState.COMMITTED, 1, committables, plan=plan, waves_prepared=3)
    assert budget(StarRocksTarget(), [record]).endswith(
        "largest batch recorded: 300 tables, 1200 transactions in 3 wave(s) (batch 7)")
    assert largest_wave(record) == 500  # what the label memory must hold while a wave commits, not the 1200


def test_doctor_verdicts(tmp_path, kafka_broker, new_topic):
    topic = new_topic(partitions=1)
    with open_target(tmp_path / "ch", DB) as target:
        client = target.client()
        client.command(f"CREATE DATABASE {DB}")
        client.command(f"CREATE TABLE {DB}.orders (id Int64, name Nullable(String), kafka_partition Int32, "
                       "kafka_offset Int64) ENGINE = MergeTree ORDER BY id")
    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, topic), "6 hours")
    assert code == 0, checks
    assert {name: c["verdict"] for name, c in checks.items()} == {
        "kafka": "OK", "state store": "OK", "state store durability": "OK", "target": "OK", "tables": "OK",
        "target server": "OK", "transaction budget": "OK", "timeout commit ledger": "OK", "timeout prepared staging tables": "OK",
    }

    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, "no-such-topic"), "60 days")
    assert code == 1
    assert checks["kafka"]["verdict"] == "FAIL" and "['no-such-topic'] do not exist" in checks["kafka"]["detail"]
    assert checks["timeout commit ledger"]["verdict"] == "OK"  # the ledger keeps its rows: no outage is too long

    with open_target(tmp_path / "ch", DB) as target:
        target.client().command(f"ALTER TABLE {DB}.orders DROP COLUMN name")
    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, topic), "1 hour")
    assert code == 1 and checks["tables"]["verdict"] == "FAIL"
    assert "table 'orders' has no column(s) ['name']" in checks["tables"]["detail"]
