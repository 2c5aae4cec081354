"""Tests of the test doubles: the Stream Load emulators (tests/support/doubles/emulators)."""
