"""A real PostgreSQL server for the change-data tests: logical replication on, one database, one CDC user.

Runs Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``, installed by scripts/setup.sh) on a
free loopback port, TCP only. ``initdb`` and the server refuse to run as root, so when we are root they run as the
package's own ``postgres`` account (``setpriv --reuid``): it exists wherever the package is installed, exists to
run PostgreSQL servers, and owns nothing else of ours. Its data directory is a fresh directory under the system
temp dir owned by that account (pytest's ``tmp_path`` sits in a root-only directory the account cannot enter);
``remove()`` (the context manager's exit) deletes it, and so does Python's exit; ``stop()``/``kill()`` keep it
for a restart. The log stays in the caller's directory (the parent opens it, the server writes to the fd).

The CDC user owns the database, so the tables it creates are its own, which Debezium needs to create a
publication for them (``publication.autocreate.mode=filtered``), and it has REPLICATION for the slot.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.support.services._proc import (
    LocalService,
    ProcessGuard,
    ServiceError,
    exit_problem,
    log_since,
    spawn,
    stop_process,
    wait_until,
)
from tests.support.services.ports import free_port

HOST = "127.0.0.1"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
#: The account Debian's package creates; runs the server when we are root.
SERVER_ACCOUNT = "postgres"

#: Server settings: logical decoding for Debezium, and small, quick, TCP-only for a shared 2-core machine.
SETTINGS = {
    "listen_addresses": HOST,
    "unix_socket_directories": "",
    "wal_level": "logical",
    "max_replication_slots": "16",  # one per connector; tests use a slot name of their own each
    "max_wal_senders": "16",
    "shared_buffers": "32MB",
    "max_connections": "40",
    # A killed *process* loses nothing with fsync off (the page cache survives it); only an OS crash would.
    # (synchronous_commit stays on: off, a kill loses the commits still in the WAL buffers, in shared memory.)
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
}


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.parent.name))


def server_bin_dir() -> Path:
    """``bin`` of the newest PostgreSQL Debian's package installed (``/usr/lib/postgresql/<version>/bin``)."""
    found = sorted(DEBIAN_ROOT.glob("*/bin/postgres"), key=_version_key)
    if not found:
        raise ServiceError(f"no PostgreSQL under {DEBIAN_ROOT}/<version>/bin: run scripts/setup.sh (Debian: postgresql)")
    return found[-1].parent


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, already dead, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class PostgresServer(LocalService):
    """A PostgreSQL server with database ``database`` owned by ``user`` (LOGIN REPLICATION, password auth).

    Use as a context manager or call ``stop()``; the server is also killed when this object is collected, when
    Python exits, and (setpriv's parent-death signal) when Python is killed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        database: str = "shop",
        user: str = "cdc",
        start_timeout: float = 60.0,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.database = database
        self.user = user
        self.password = secrets.token_urlsafe(12)
        self.start_timeout = start_timeout
        self.log_path = self.directory / "postgres.log"
        self.port: int | None = None
        self.bin_dir = server_bin_dir()
        self._superuser_password = secrets.token_urlsafe(12)
        self._data_root: Path | None = None
        self._remove_data: weakref.finalize[Any, Any] | None = None  # also runs when Python exits
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard: ProcessGuard | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """initdb (first start only), start the server, and create the CDC user and database (first start only)."""
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        fresh = self._data_root is None
        if fresh:
            self._init_cluster()
            self.port = free_port()
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        settings = [arg for key, value in {**SETTINGS, "port": str(self.port)}.items() for arg in ("-c", f"{key}={value}")]
        # The parent-death signal is cleared when a process changes its user, so it is set after the change,
        # by the same setpriv (spawn's own setpriv would set it before).
        self._proc = spawn(
            [*self._as_server_account(die_with_parent=True), str(self.bin_dir / "postgres"), "-D", str(self.data_dir),
             *settings],
            log_path=self.log_path,
            cwd=self.data_dir,
            die_with_parent=False,
        )
        self._guard = ProcessGuard(self, self._proc)
        try:
            wait_until(
                lambda: self._connects(),
                timeout=self.start_timeout,
                what=f"PostgreSQL on {HOST}:{self.port}",
                alive=lambda: exit_problem(self._proc),
            )
        except ServiceError as exc:
            self.kill()
            raise ServiceError(f"{exc}\n--- {self.log_path} ---\n{log_since(self.log_path, log_offset)[-4000:]}") from None
        if fresh:
            self._create_user_and_database()
        return self

    def stop(self, timeout: float = 30.0, *, hard: bool = False) -> None:
        """Stop the server (``hard``: SIGKILL, a crash); its data stays, and ``start()`` brings it back on its port."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if hard:
                # The whole process group, backends too, as a machine crash would: a backend that outlived its
                # postmaster would keep the shared memory attached and the next start would refuse to run.
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                # SIGINT is PostgreSQL's fast shutdown: it ends open sessions (Connect's replication connection)
                # at once, where SIGTERM (smart) waits for them to leave.
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                stop_process(proc, hard=True)
            wait_until(lambda: not _group_alive(proc.pid), timeout=timeout, what="PostgreSQL's processes to exit")
        self._release()

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); ``start()`` recovers it from its WAL."""
        self.stop(hard=True)

    def remove(self) -> None:
        """Stop the server and delete its data directory; the next ``start()`` makes a new cluster."""
        self.stop()
        if self._remove_data is not None:
            self._remove_data()
            self._remove_data = None
        self._data_root = None
        self.port = None

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- clients -----------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        if self._data_root is None:
            raise ServiceError("PostgresServer is not started")
        return self._data_root / "data"

    def conninfo(self, *, superuser: bool = False) -> str:
        """libpq connection string for the CDC user (or the superuser ``postgres``) on the database."""
        if self.port is None:
            raise ServiceError("PostgresServer is not started")
        user, password = ("postgres", self._superuser_password) if superuser else (self.user, self.password)
        return make_conninfo(
            host=HOST, port=self.port, dbname=self.database if not superuser else "postgres",
            user=user, password=password, connect_timeout=5,
        )

    def connect(self, *, autocommit: bool = False, superuser: bool = False) -> psycopg.Connection[tuple[object, ...]]:
        """A psycopg connection as the CDC user (the owner of the database and of the tables it creates)."""
        return psycopg.connect(self.conninfo(superuser=superuser), autocommit=autocommit)

    def replication_slots(self) -> dict[str, bool]:
        """Replication slots of the server: name -> active (a connector is streaming from it)."""
        with self.connect(superuser=True) as conn:
            rows = conn.execute("SELECT slot_name, active FROM pg_replication_slots").fetchall()
        return {str(name): bool(active) for name, active in rows}

    def debezium_properties(self) -> dict[str, str]:
        """The ``database.*`` settings of a Debezium PostgreSQL connector for this server."""
        return {
            "database.hostname": HOST,
            "database.port": str(self.port),
            "database.user": self.user,
            "database.password": self.password,
            "database.dbname": self.database,
        }

    # -- internals ---------------------------------------------------------------------------

    def _as_server_account(self, *, die_with_parent: bool = False) -> list[str]:
        """setpriv prefix: as the server account when we are root, and with a parent-death SIGKILL if asked."""
        death = ["--pdeathsig", "KILL"] if die_with_parent else []
        if os.geteuid() != 0:
            setpriv = shutil.which("setpriv")  # an ordinary user runs its own server
            return [setpriv, *death, "--"] if setpriv and death else []
        try:
            account = pwd.getpwnam(SERVER_ACCOUNT)
        except KeyError:
            raise ServiceError(f"no '{SERVER_ACCOUNT}' account (Debian's postgresql package makes it): "
                               "run scripts/setup.sh") from None
        setpriv = shutil.which("setpriv")
        if not setpriv:
            raise ServiceError("setpriv not found (Debian: util-linux); it runs PostgreSQL as an unprivileged user")
        return [setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", *death, "--"]

    def _init_cluster(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="streaming-sink-pg-"))
        self._data_root = root
        self._remove_data = weakref.finalize(self, shutil.rmtree, root, True)
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_ACCOUNT)
            os.chown(root, account.pw_uid, account.pw_gid)
        password_file = root / "superuser.password"
        password_file.write_text(self._superuser_password + "\n")
        if os.geteuid() == 0:
            os.chown(password_file, account.pw_uid, account.pw_gid)
        argv = [
            *self._as_server_account(), str(self.bin_dir / "initdb"),
            "-D", str(root / "data"), "--username=postgres", f"--pwfile={password_file}",
            "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        ]  # fmt: skip
        proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)
        password_file.unlink()
        if proc.returncode != 0:
            self.remove()
            raise ServiceError(f"initdb failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def _connects(self) -> bool:
        with psycopg.connect(self.conninfo(superuser=True)) as conn:
            conn.execute("SELECT 1")
        return True

    def _create_user_and_database(self) -> None:
        with self.connect(superuser=True, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(self.password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(self.database), sql.Identifier(self.user)
                )
            )

