"""A real ``redis-server`` (the distribution's binary) with durable AOF, for state-store tests.

``appendonly yes`` + ``appendfsync always`` makes every acknowledged write survive a restart
or a SIGKILL, which is what the sink's state store relies on in production. The topologies production
runs are built from the same binary: a TLS-only server (``tls=``), a primary with a replica and three
Sentinels (``RedisSentinelGroup``), a three-master Cluster (``RedisClusterGroup``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from tests.support.services._proc import (
    LocalService,
    ProcessGuard,
    ServiceError,
    exit_problem,
    log_since,
    log_tail,
    spawn,
    wait_until,
)
from tests.support.services.ports import free_port

HOST = "127.0.0.1"


def redis_server_executable() -> str:
    """Path of ``redis-server``; scripts/setup.sh installs it (Debian package redis-server)."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if not found:
        raise ServiceError("redis-server not found: run scripts/setup.sh (apt-get install redis-server)")
    return found


class RedisServer(LocalService):
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
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        """``password``: started with ``--requirepass`` (to test that the sink never shows it); ``url`` carries it.
        ``tls``: (CA, certificate, key) files; the server then speaks only TLS and asks clients for a certificate the
        CA signed, and ``url`` is a ``rediss://`` URL that presents the same certificate."""
        self.directory = Path(directory).resolve()
        self.password = password
        self.tls = tls
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
        if self.tls:
            ca, cert, key = (quote(path, safe="/") for path in self.tls)
            return f"rediss://{auth}{HOST}:{self.port}/0?ssl_ca_certs={ca}&ssl_certfile={cert}&ssl_keyfile={key}"
        return f"redis://{auth}{HOST}:{self.port}/0"

    def start(self) -> RedisServer:
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
                self.kill()
                if fresh and attempt < attempts and "Address already in use" in log_since(self.log_path, log_offset):
                    continue
                if fresh:
                    self.port = None
                raise ServiceError(
                    f"{exc}\n--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
                ) from None
        raise AssertionError("unreachable")

    # stop: SIGTERM (Redis fsyncs the AOF and exits), SIGKILL at the deadline; kill: an outage, and with
    # ``appendfsync always`` no acknowledged write is lost (LocalService)
    stop_timeout = 20.0

    def restart(self) -> RedisServer:
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        return self.start()

    def client(self, **kwargs: object):  # -> redis.Redis
        """A redis-py client for this server (caller closes it)."""
        import redis

        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis.from_url(self.url, **kwargs)

    def pause(self) -> None:
        """SIGSTOP: the server stays connected but answers nothing (a replica that falls behind)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)


    def _argv(self) -> list[str]:
        return [
            redis_server_executable(),
            "--bind",
            HOST,
            *(["--port", "0", "--tls-port", str(self.port), "--tls-ca-cert-file", self.tls[0], "--tls-cert-file",
               self.tls[1], "--tls-key-file", self.tls[2], "--tls-auth-clients", "yes"] if self.tls
              else ["--port", str(self.port)]),
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
        tls = dict(ssl=True, ssl_ca_certs=self.tls[0], ssl_certfile=self.tls[1], ssl_keyfile=self.tls[2]) if self.tls else {}
        client = redis.Redis(
            host=HOST,
            port=self.port or 0,
            password=self.password,
            socket_connect_timeout=1,
            socket_timeout=1,
            retry=Retry(NoBackoff(), 0),
            **tls,  # type: ignore[arg-type]
        )
        try:
            return bool(client.ping())
        except redis.exceptions.BusyLoadingError:
            return False  # replaying the AOF after a restart
        finally:
            client.close()



class RedisSentinelGroup:
    """A primary, a replica and three Sentinels watching them (quorum 2), on free loopback ports.

    `url` is the sink's `redis+sentinel://` URL. `kill_primary()` and `promoted()` stage a failover the way it
    happens in production: the master dies, the Sentinels agree it is down and promote the replica.
    """

    MASTER = "journal"

    def __init__(self, directory: str | os.PathLike[str], down_after_ms: int = 1000) -> None:
        self.directory = Path(directory).resolve()
        self.down_after_ms = down_after_ms
        # a paused replica is dropped by its primary after 3 s (the primary pings every second), so a test can make
        # writes that reach the primary only: until then they would wait in the paused replica's socket buffer. A full
        # sync starts at once (Redis 7 waits 5 s for more replicas by default, and a killed master that comes back
        # needs one): the old master rejoins in seconds, as a failover test expects
        timeouts = ["--repl-timeout", "3", "--repl-ping-replica-period", "1", "--repl-diskless-sync-delay", "0"]
        self.servers = [RedisServer(self.directory / name, extra_args=list(timeouts)) for name in ("a", "b")]
        self.sentinels: list[RedisServer] = []

    @property
    def url(self) -> str:
        nodes = ",".join(f"{HOST}:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{nodes}/{self.MASTER}/0"

    def start(self) -> RedisSentinelGroup:
        primary, replica = self.servers
        primary.start()
        replica.extra_args += ["--replicaof", HOST, str(primary.port)]
        replica.start()
        self.wait_in_sync(primary)
        for index in range(3):
            sentinel = _Sentinel(self.directory / f"sentinel-{index}", self.MASTER, primary.port or 0,
                                 self.down_after_ms)
            self.sentinels.append(sentinel.start())
        wait_until(self._sentinels_ready, timeout=30, what="three Sentinels that see the master, its replica and "
                                                           "each other")
        return self

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            if server.running:
                server.resume()  # a paused server ignores SIGTERM until it runs again
            server.stop()

    def master_port(self) -> int:
        """The master's port as the Sentinels name it."""
        with self.sentinels[0].client() as client:
            _, port = client.sentinel_get_master_addr_by_name(self.MASTER)
        return int(port)

    def master(self) -> RedisServer:
        port = self.master_port()
        return next(server for server in self.servers if server.port == port)

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current master; returns it (restart it with `rejoin`)."""
        primary = self.master()
        primary.kill()
        return primary

    def promoted(self, old: RedisServer, timeout: float = 60) -> RedisServer:
        """Wait until the Sentinels name another master and it answers as one; that server."""

        def switched() -> bool:
            return self.master_port() != old.port and self._role(self.master()) == "master"

        wait_until(switched, timeout=timeout, what="the Sentinels' failover")
        return self.master()

    def rejoin(self, old: RedisServer, timeout: float = 60) -> None:
        """Start a killed server again as a replica of the new master and wait until it is in sync. It is told so at
        once, as the Sentinels would tell it on their next look (their check comes every few seconds, and a loaded
        machine made it take over two minutes)."""
        old.start()
        master = self.master()
        with old.client() as client:
            client.execute_command("REPLICAOF", HOST, str(master.port))
        deadline = time.monotonic() + timeout
        try:
            wait_until(lambda: self._role(old) == "slave", timeout=timeout,
                       what="the old master to rejoin as a replica")
            self.wait_in_sync(master, timeout=max(1.0, deadline - time.monotonic()))
        except ServiceError as error:
            logs = "".join(f"\n--- last lines of {server.log_path} ---\n{log_tail(server.log_path, 15)}"
                           for server in (old, master))
            raise ServiceError(f"{error}{logs}") from error

    def detach_replica(self) -> RedisServer:
        """Pause the replica and wait until the master dropped it: from then on, writes reach the master only."""
        master = self.master()
        replica = next(server for server in self.servers if server is not master)
        replica.pause()

        def dropped() -> bool:
            with master.client() as client:
                return int(client.info("replication")["connected_slaves"]) == 0

        wait_until(dropped, timeout=30, what="the master to drop its paused replica")
        return replica

    @classmethod
    def wait_in_sync(cls, primary: RedisServer, timeout: float = 30) -> None:
        """Wait until a replica is online and has acknowledged every byte `primary` had written once it was online.

        Equal offsets are not the test: the Sentinels' hellos and the primary's pings move the primary's offset every
        second and a replica acknowledges once a second, so a writing job or an unlucky phase kept them apart for the
        two minutes a failover test waited."""
        deadline = time.monotonic() + timeout
        written, _ = wait_until(lambda: cls._offsets(primary), timeout=timeout, what="a replica online at the primary")
        wait_until(lambda: (cls._offsets(primary) or (0, -1))[1] >= written,
                   timeout=max(1.0, deadline - time.monotonic()), what="a replica in sync with the primary")

    @staticmethod
    def _offsets(primary: RedisServer) -> tuple[int, int] | None:
        """The primary's offset and the one its replica last acknowledged; None while no replica is online."""
        with primary.client() as client:
            info = client.info("replication")
        replica = info.get("slave0")
        if not (isinstance(replica, dict) and replica.get("state") == "online"):
            return None
        return int(info["master_repl_offset"]), int(replica.get("offset", -1))

    @staticmethod
    def _role(server: RedisServer) -> str:
        try:
            with server.client(socket_timeout=2) as client:
                return str(client.info("replication")["role"])
        except Exception:
            return "down"

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                master = client.sentinel_master(self.MASTER)
                if int(master.get("num-slaves", 0)) < 1 or int(master.get("num-other-sentinels", 0)) < 2:
                    return False
        return True

    def __enter__(self) -> RedisSentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Sentinel(RedisServer):
    """`redis-server --sentinel` watching one master; its config file is its own (Sentinel rewrites it)."""

    def __init__(self, directory: Path, master: str, master_port: int, down_after_ms: int) -> None:
        super().__init__(directory)
        self.master, self.master_port, self.down_after_ms = master, master_port, down_after_ms

    def _argv(self) -> list[str]:
        config = self.directory / "sentinel.conf"
        if not config.exists():
            # a Sentinel does not fail the same master over again within twice the failover timeout: with 10 s, a
            # test's second failover waited 20 s for the first one's
            config.write_text(
                f"port {self.port}\nbind {HOST}\ndir {self.directory}\nprotected-mode no\n"
                f"sentinel monitor {self.master} {HOST} {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master} 3000\n"
            )
        return [redis_server_executable(), str(config), "--sentinel"]


class RedisClusterGroup:
    """A Redis Cluster of `size` masters (no replicas) on free loopback ports; `url` is the sink's
    `redis+cluster://` URL."""

    def __init__(self, directory: str | os.PathLike[str], size: int = 3) -> None:
        self.directory = Path(directory).resolve()
        self.servers = [
            RedisServer(self.directory / f"node-{index}", extra_args=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                "--cluster-port", str(free_port())])  # the bus port, else port + 10000, too high for a free port
            for index in range(size)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{server.port}" for server in self.servers)

    def start(self) -> RedisClusterGroup:
        for server in self.servers:
            server.start()
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        subprocess.run([cli, "--cluster", "create", *(f"{HOST}:{server.port}" for server in self.servers),
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        wait_until(self._ready, timeout=30, what="every cluster node to report cluster_state:ok")
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def flush(self) -> None:
        for server in self.servers:
            with server.client() as client:
                client.flushall()

    def _ready(self) -> bool:
        for server in self.servers:
            with server.client() as client:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
        return True

    def __enter__(self) -> RedisClusterGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
