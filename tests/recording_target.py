"""Moved to tests/support/doubles/recording.py; this name stays for one release."""
from tests.support.doubles.recording import RecordingTarget

__all__ = ["RecordingTarget"]
