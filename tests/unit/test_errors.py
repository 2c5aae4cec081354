"""Every error the sink defines has one root, so a caller can catch the sink's failures as one kind."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import streaming_sink
from streaming_sink.errors import StreamingSinkError


def defined_errors() -> list[type[BaseException]]:
    found = []
    for package in (streaming_sink,):  # streaming_sink.state (the repository's state/) included
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.endswith((".launch", ".__main__")):
                continue  # entry points run the job when imported
            loaded = importlib.import_module(module.name)
            found += [obj for _, obj in inspect.getmembers(loaded, inspect.isclass)
                      if issubclass(obj, BaseException) and obj.__module__ == module.name]
    return found


def test_every_error_of_the_sink_has_the_one_root():
    errors = defined_errors()
    assert len(errors) >= 20, errors  # the walk found the modules
    assert [e.__qualname__ for e in errors if not issubclass(e, StreamingSinkError)] == []


def test_builtin_bases_stay_for_existing_callers():
    from streaming_sink.errors import ConfigurationError, InvariantBreach
    from streaming_sink.targets import ConfigurationError as reexported

    assert reexported is ConfigurationError and issubclass(ConfigurationError, ValueError)
    assert issubclass(InvariantBreach, RuntimeError)


def test_the_tree_in_the_errors_module_is_the_tree_of_the_classes():
    """errors.py's docstring shows every error class; regenerate it with `error_tree()` when a class moves or joins."""
    from streaming_sink import errors

    defined_errors()  # every module loaded
    tree = "\n".join("    " + line for line in errors.error_tree().splitlines())
    assert tree in errors.__doc__, f"paste into streaming_sink/errors.py's docstring:\n{tree}"


def test_every_error_says_its_exit_code_and_one_line():
    from streaming_sink.errors import CliError, ExitCode, StateStoreLostError

    assert StateStoreLostError("j", 2, 1).exit_code is ExitCode.REFUSED
    assert StateStoreLostError("j", 2, 1).runbook_section == "State store lost or rolled back"
    assert str(StateStoreLostError("j", 2, 1)).endswith("See docs/runbook.md, section 'State store lost or rolled back'.")
    assert CliError(ExitCode.USAGE, "no such batch").one_line() == "no such batch"
    for error in defined_errors():
        if issubclass(error, StreamingSinkError):
            assert isinstance(error.exit_code, ExitCode) and "{error}" in error.headline, error
