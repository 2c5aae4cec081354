"""Moved: the emulators live in tests/support/doubles/emulators, their tests in tests/doubles. `tests.emulators.<module>`
stays importable for one release (the same module objects, not copies)."""
import importlib
import sys

_MODULES = ("base_emulator", "client", "clock", "column_types", "conversion", "doris", "faults", "http_server",
            "load_formats", "profiles", "starrocks", "store")
for _name in _MODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"tests.support.doubles.emulators.{_name}")
