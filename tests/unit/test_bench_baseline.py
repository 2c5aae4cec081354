"""The bench's at-least-once baseline keeps up with the state store contract (a new abstract method of
StateStore once broke three bench modes at run time, long after the suite was green)."""
from __future__ import annotations

import pickle

from bench.baseline import NullJournal


def test_the_null_journal_fulfils_the_store_contract_and_travels_to_tasks() -> None:
    journal = pickle.loads(pickle.dumps(NullJournal()))
    assert journal.epoch_owner("job") is None and journal.batch_keys("job") == []
