"""A real ``redis-server`` (the distribution's binary) with durable AOF, for state-store tests.

``appendonly yes`` + ``appendfsync always`` makes every acknowledged write survive a restart
or a SIGKILL, which is what the sink's state store relies on in production.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from devstack._proc import (
    ProcessGuard,
    ServiceError,
    exit_problem,
    log_since,
    log_tail,
    spawn,
    stop_process,
    wait_until,
)
from devstack.ports import free_port

HOST = "127.0.0.1"


def redis_server_executable() -> str:
    """Path of ``redis-server``; scripts/setup.sh installs it (Debian package redis-server)."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if not found:
        raise ServiceError("redis-server not found: run scripts/setup.sh (apt-get install redis-server)")
    return found


class RedisServer:
    """``redis-server`` on a free loopback port with its data in ``directory``.

    ``restart()`` and ``kill()``/``start()`` keep port and data, so clients reconnect to the
    same URL and find every write acknowledged before the stop.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        start_timeout: float = 30.0,
        extra_args: list[str] | None = None,
        password: str | None = None,
    ) -> None:
        """``password``: started with ``--requirepass`` (to test that the sink never shows it); ``url`` carries it."""
        self.directory = Path(directory).resolve()
        self.password = password
        self.start_timeout = start_timeout
        self.extra_args = list(extra_args or [])
        self.log_path = self.directory / "redis.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard: ProcessGuard | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``redis://:PASSWORD@127.0.0.1:PORT/0`` with a password)."""
        if self.port is None:
            raise ServiceError("RedisServer is not started")
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "RedisServer":
        """Start (or start again, same port and data) and wait until PING answers."""
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        fresh = self.port is None
        attempts = 3 if fresh else 1
        for attempt in range(1, attempts + 1):
            if fresh:
                self.port = free_port()
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = spawn(self._argv(), log_path=self.log_path, cwd=self.directory)
            self._guard = ProcessGuard(self, self._proc)
            try:
                wait_until(
                    self._ping,
                    timeout=self.start_timeout,
                    what=f"redis-server on {HOST}:{self.port}",
                    alive=lambda: exit_problem(self._proc),
                )
                return self
            except ServiceError as exc:
                self._stop(hard=True)
                if fresh and attempt < attempts and "Address already in use" in log_since(self.log_path, log_offset):
                    continue
                if fresh:
                    self.port = None
                raise ServiceError(
                    f"{exc}\n--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
                ) from None
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 20.0) -> None:
        """Graceful stop (SIGTERM: Redis fsyncs the AOF and exits); SIGKILL at the deadline."""
        self._stop(hard=False, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, an outage/crash; with ``appendfsync always`` no acknowledged write is lost."""
        self._stop(hard=True)

    def restart(self) -> "RedisServer":
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        return self.start()

    def client(self, **kwargs: object):  # -> redis.Redis
        """A redis-py client for this server (caller closes it)."""
        import redis

        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis.from_url(self.url, **kwargs)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _argv(self) -> list[str]:
        return [
            redis_server_executable(),
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",  # no RDB snapshots: the AOF alone is the durable copy, as in production config
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            "",  # stdout, which spawn() appends to redis.log
            *(["--requirepass", self.password] if self.password else []),
            *self.extra_args,
        ]

    def _ping(self) -> bool:
        import redis

        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No client-side retries: redis-py's default backoff would hide a dead server for
        # seconds; wait_until() is the retry loop here.
        client = redis.Redis(
            host=HOST,
            port=self.port or 0,
            password=self.password,
            socket_connect_timeout=1,
            socket_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except redis.exceptions.BusyLoadingError:
            return False  # replaying the AOF after a restart
        finally:
            client.close()

    def _stop(self, *, hard: bool, timeout: float = 20.0) -> None:
        stop_process(self._proc, timeout, hard=hard)
        if self._guard is not None:
            self._guard.detach()
            self._guard = None
        self._proc = None
