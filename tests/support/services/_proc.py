"""Child-process plumbing shared by the local services: start, poll for readiness, stop.

Why a helper: every service must be cleaned up whatever happens to the test run (normal exit,
exception, pytest-timeout's ``os._exit``, even SIGKILL of the runner), and readiness is always a
poll with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self, TypeVar

T = TypeVar("T")


class ServiceError(RuntimeError):
    """A local service failed to start or to answer in time."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    max_interval: float = 0.5,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Call ``probe`` until it returns something other than None/False, or fail at the deadline.

    ``alive`` is checked before each probe and returns an error text when waiting is pointless
    (e.g. the process exited). The poll interval grows so a slow start costs little CPU.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if alive is not None:
            problem = alive()
            if problem:
                raise ServiceError(f"{what}: {problem}")
        try:
            result = probe()
            if result is not None and result is not False:
                return result
        except Exception as exc:  # noqa: BLE001 - the probe's failures are the signal we poll on
            last_exc = exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise ServiceError(f"{what}: not ready after {timeout:.0f}s{detail}")
        # Event-free wait between probes: bounded by the deadline, not a synchronisation sleep.
        time.sleep(min(interval, remaining))
        interval = min(interval * 1.5, max_interval)


def log_tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def log_since(path: Path, offset: int) -> str:
    """Log text written after byte ``offset`` (what the current start attempt wrote)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _pdeathsig_prefix() -> list[str]:
    # setpriv (util-linux) makes the kernel SIGKILL the child when the thread that started it
    # dies, which covers the cases atexit cannot: os._exit (pytest-timeout) and SIGKILL.
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout+stderr appended to ``log_path``.

    With ``die_with_parent`` the child is killed when the process that started it dies. The kernel
    ties that signal to the starting *thread*, so a child started from any other thread (a failover
    test restarting a killed server in the background) is not tied to it: it would die when that
    thread ends. ProcessGuard still stops it with its owner or at the interpreter's exit.
    """
    tied = die_with_parent and threading.current_thread() is threading.main_thread()
    prefix = _pdeathsig_prefix() if tied else []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [*prefix, *argv],
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal goes to pytest, which stops us cleanly
        )


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0, *, hard: bool = False) -> None:
    """Terminate (or with ``hard`` kill) ``proc`` and reap it; escalate to SIGKILL at the deadline."""
    if proc is None or proc.poll() is not None:
        return
    try:
        if hard:
            proc.kill()
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class ProcessGuard:
    """Kills a child process when its owner is garbage-collected or the interpreter exits."""

    def __init__(self, owner: object, proc: subprocess.Popen[bytes]) -> None:
        self._finalizer = weakref.finalize(owner, stop_process, proc, 5.0, hard=True)

    def detach(self) -> None:
        """The owner stopped the process itself; nothing left to clean up."""
        self._finalizer.detach()


class LocalService:
    """What every local service shares: one process (``_proc``, guarded by ``_guard`` so that it dies with the tests),
    ``running``, ``stop`` (SIGTERM, SIGKILL at the deadline), ``kill`` (a crash) and ``with`` (start, then stop). A
    service's ``start`` sets both; one that ends its own way overrides ``stop``/``kill`` and calls ``_release``."""

    _proc: subprocess.Popen[bytes] | None = None
    _guard: ProcessGuard | None = None
    stop_timeout: float = 30.0

    def start(self) -> Self:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float | None = None) -> None:
        stop_process(self._proc, self.stop_timeout if timeout is None else timeout)
        self._release()

    def kill(self) -> None:
        """SIGKILL (crash simulation); ``start()`` brings the service back with its data."""
        stop_process(self._proc, hard=True)
        self._release()

    def _release(self) -> None:
        if self._guard is not None:
            self._guard.detach()
            self._guard = None
        self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_problem(proc: subprocess.Popen[bytes] | None) -> str | None:
    """Error text if ``proc`` has exited, for :func:`wait_until`'s ``alive``."""
    if proc is None:
        return "process not started"
    code = proc.poll()
    if code is None:
        return None
    return f"process exited with code {code}"


def java_executable() -> str:
    """The ``java`` to run services with: $JAVA_HOME/bin/java if set, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("java")
    if not found:
        raise ServiceError("java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)")
    return found
