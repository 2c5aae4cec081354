"""Shared fixtures come from one module, tests/support/fixtures.py."""
from tests.support.fixtures import *  # noqa: F401,F403


def pytest_addoption(parser) -> None:  # type: ignore[no-untyped-def]
    parser.addoption("--extended", action="store_true",
                     help="run the extended suite (tests marked `extended`: proofs too heavy for CI) instead of the rest")


def pytest_collection_modifyitems(config, items) -> None:  # type: ignore[no-untyped-def]
    """The default run leaves out the extended suite; `--extended` runs only it."""
    extended = config.getoption("--extended")
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("extended") is not None) == extended else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
