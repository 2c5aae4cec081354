"""Invariant I4: labels are deterministic, valid for every target, short enough, and never collide."""
import itertools
import re
import uuid

from streaming_sink.labels import LABEL_MAX_LENGTH, label_batch, label_prefix, make_label

VALID = re.compile(r"^[-_A-Za-z0-9]+$")


def test_label_is_deterministic():
    args = ("orders-ingest", "3f2c6a1e-1111-2222-3333-444455556666", 7, "orders", 3, "e2w0t1", 0)
    assert make_label(*args) == make_label(*args)


def test_label_characters_and_length_for_hostile_inputs():
    hostile_job = "job with spaces/and:colons" * 5
    hostile_table = "таблица.with`backticks'and\"quotes" * 4
    label = make_label(hostile_job, str(uuid.uuid4()), 10**15, hostile_table, 9999, "e123456w99t42", 123456)
    assert VALID.match(label), label
    assert len(label) <= LABEL_MAX_LENGTH


def test_labels_differ_in_every_component():
    base = ["job", "q-1", 1, "orders", 0, "e1w0t0", 0]
    variants = {
        0: "job2", 1: "q-2", 2: 2, 3: "payments", 4: 1, 5: "e1w0t1", 6: 1,
    }
    labels = {make_label(*base)}
    for index, value in variants.items():
        changed = list(base)
        changed[index] = value
        labels.add(make_label(*changed))
    assert len(labels) == 1 + len(variants)


def test_labels_unique_across_query_ids_even_when_sanitised_alike():
    # Two tables whose names sanitise to the same readable text must still get different labels.
    a = make_label("job", "q", 1, "or-ders", 0, "e1w0t0")
    b = make_label("job", "q", 1, "or.ders", 0, "e1w0t0")
    assert a != b
    labels = {
        make_label("job", str(uuid.uuid4()), batch, "t", partition, "e1w0t0")
        for batch, partition in itertools.product(range(20), range(5))
        for _ in range(3)
    }
    assert len(labels) == 20 * 5 * 3


def test_a_label_parses_back_into_what_it_was_made_of():
    from streaming_sink.labels import Attempt, LabelParts, parse_label

    query = "3f2c6a1e-1111-2222-3333-444455556666"
    for job, table in (("orders_ingest", "orders"), ("job", "t_2024_05_p1"), ("j-1", "x")):
        label = make_label(job, query, 17, table, 3, "e2w1t40", 5)
        assert parse_label(label, job) == LabelParts("3f2c6a1e", 17, table, 3, Attempt(2, 1, 40), 5)
        assert parse_label(label[:-13] + "_twin_0123", job) == parse_label(label, job)  # a test twin's staging name
        assert parse_label(label, job + "x") is None
    assert parse_label(make_label("job", "query-1", 0, "t", -3, "e1w0t0"), "job").partition == -3
    assert parse_label(make_label("j" * 30, query, 1, "t" * 200, 0, "e1w0t0"), "j" * 30).table == "t" * 24
    assert parse_label("ss_probe", "job") is None


def test_a_labels_batch_and_its_job_and_query_are_read_back():
    """What the ClickHouse ledger's retention counts by: names that look like a label's parts do not fool it."""
    cases = [("orders-ingest", str(uuid.uuid4()), 7, "orders", 3), ("a_b_5_orders_p0_x", "q_1", 123, "orders", 0),
             ("job", "q", 10**12, "shop.orders", 99999), ("x" * 64, "q" * 40, 0, "t" * 64, 1)]
    for job, query, batch, table, partition in cases:
        label = make_label(job, query, batch, table, partition, "e12w3t456", 2)
        assert label_batch(label, table, partition) == (label_prefix(job, query).rstrip("_"), batch), label
    assert label_batch(make_label("job", "q", 1, "orders", 0, "e1w0t0"), "payments", 0) is None
    assert label_batch("ss_job_q_x_orders_p0_e1w0t0_c0_0123456789ab", "orders", 0) is None  # not a batch number


def test_the_clickhouse_ledger_keeps_more_batches_than_the_journal_can_ask_about():
    import inspect

    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.targets.clickhouse.ledger import FORGET_EVERY, HORIZON_BATCHES

    retained = inspect.signature(ExactlyOnceSink).parameters["retain_batches"].default
    assert 10 * retained <= HORIZON_BATCHES and retained >= FORGET_EVERY
