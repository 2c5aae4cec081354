"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) for tests/demos.

Runs ``kafka.Kafka`` from the Maven Central jars (see :mod:`devstack.jars`) on free loopback
ports, with its data and log in a directory the caller owns. Clients are kafka-python.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Iterable

from devstack import jars
from devstack._proc import (
    ProcessGuard,
    ServiceError,
    exit_problem,
    java_executable,
    log_since,
    log_tail,
    spawn,
    stop_process,
    wait_until,
)
from devstack.ports import free_ports, port_accepts

HOST = "127.0.0.1"

#: JVM options: small heap and few GC threads, the machines have 2 cores and run Spark too.
DEFAULT_JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",  # die loudly instead of limping on
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
)


#: Log lines meaning this start attempt has failed even though the JVM may still be running.
FATAL_LOG_MARKERS = ("Exiting Kafka due to fatal exception", "Address already in use")


def _cluster_id() -> str:
    """A Kafka-style cluster id: URL-safe base64 of a random UUID, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaBroker:
    """A KRaft broker in ``directory``; ``start()`` returns once clients can create topics.

    Use as a context manager or call ``stop()``; the JVM is also killed when this object is
    collected, when Python exits, and (via setpriv's parent-death signal) if Python is killed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        version: str = jars.KAFKA_VERSION,
        start_timeout: float = 90.0,
        auto_create_topics: bool = False,
        extra_properties: dict[str, str] | None = None,
        jvm_opts: Iterable[str] = DEFAULT_JVM_OPTS,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.version = version
        self.start_timeout = start_timeout
        self.auto_create_topics = auto_create_topics
        self.extra_properties = dict(extra_properties or {})
        self.jvm_opts = list(jvm_opts)
        self.log_path = self.directory / "kafka.log"
        self.port: int | None = None
        self.controller_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard: ProcessGuard | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers`` / ``kafka.bootstrap.servers``."""
        if self.port is None:
            raise ServiceError("KafkaBroker is not started")
        return f"{HOST}:{self.port}"

    def start(self) -> "KafkaBroker":
        """Start the broker and wait until it answers metadata requests.

        The first start picks free ports and formats fresh storage; later starts (after
        ``stop()``/``kill()``) reuse the same ports and data, like a restarted server.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        classpath = jars.kafka_broker_classpath(self.version)
        fresh = self.port is None
        attempts = 3 if fresh else 1
        for attempt in range(1, attempts + 1):
            if fresh:
                # Ports are free when chosen but released before Kafka binds them; on the rare
                # clash (another process took one in between) start again on fresh ports.
                self.port, self.controller_port = free_ports(2)
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self._format(classpath, self._write_properties())
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = spawn(
                [java_executable(), *self.jvm_opts, "-cp", classpath, "kafka.Kafka", str(self.properties_path)],
                log_path=self.log_path,
                cwd=self.directory,
                env=self._java_env(),
            )
            self._guard = ProcessGuard(self, self._proc)
            try:
                self._wait_ready(log_offset)
                return self
            except ServiceError as exc:
                self.kill()  # a failed start may hang in its shutdown hooks; nothing to keep
                if attempt < attempts and "Address already in use" in log_since(self.log_path, log_offset):
                    continue
                if fresh:
                    self.port = self.controller_port = None  # next start() formats afresh
                raise ServiceError(
                    f"Kafka {self.version} broker did not start in {self.directory}: {exc}\n"
                    f"--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
                ) from None
        raise AssertionError("unreachable")

    def restart(self) -> "KafkaBroker":
        """Stop (controlled shutdown) and start again on the same ports with the same data."""
        self.stop()
        return self.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), SIGKILL if still up at the deadline."""
        stop_process(self._proc, timeout)
        if self._guard is not None:
            self._guard.detach()
            self._guard = None
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the broker (crash simulation); ``start()`` brings it back with its data."""
        stop_process(self._proc, hard=True)
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _java_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Settings meant for Spark's or the user's JVMs must not leak into the broker.
        for key in ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH"):
            env.pop(key, None)
        return env

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def properties_path(self) -> Path:
        return self.directory / "server.properties"

    def _write_properties(self) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # After a kill, the restarted broker cannot register until the controller expires
            # its previous session (default 9 s); shorter keeps crash tests quick.
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500",
            "auto.create.topics.enable": "true" if self.auto_create_topics else "false",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),  # default 128 MiB; small heap
        }
        props.update(self.extra_properties)
        path = self.properties_path
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format(self, classpath: str, props: Path) -> None:
        argv = [
            java_executable(),
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(props),
            "--cluster-id",
            _cluster_id(),
            "--ignore-formatted",
        ]
        proc = subprocess.run(
            argv, cwd=self.directory, env=self._java_env(), capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"formatting Kafka storage failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )

    def _wait_ready(self, log_offset: int) -> None:
        def alive() -> str | None:
            # After a fatal startup error Kafka can take half a minute in shutdown hooks
            # before the JVM exits; its log says so at once.
            new_log = log_since(self.log_path, log_offset)
            for marker in FATAL_LOG_MARKERS:
                if marker in new_log:
                    return f"broker logged {marker!r}"
            return exit_problem(self._proc)

        wait_until(
            lambda: port_accepts(HOST, self.port or 0),
            timeout=self.start_timeout,
            what=f"Kafka listener {HOST}:{self.port}",
            alive=alive,
        )
        # The listener accepts before the broker has caught up with the metadata log; a
        # metadata round trip with our broker listed is the real "ready".
        def metadata_ready() -> bool:
            # Short client timeouts: one probe must not outlast a failure alive() would see.
            admin = self.admin(request_timeout_ms=3000, bootstrap_timeout_ms=3000)
            try:
                return bool(admin.describe_cluster().get("brokers"))
            finally:
                admin.close()

        wait_until(metadata_ready, timeout=self.start_timeout, what="Kafka metadata", alive=alive)

    # -- clients -----------------------------------------------------------------------------

    def admin(self, **configs: object):  # -> kafka.KafkaAdminClient
        """A kafka-python admin client for this broker (caller closes it)."""
        from kafka import KafkaAdminClient

        configs.setdefault("request_timeout_ms", 30000)
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="devstack-admin", **configs)

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
        """Create ``name`` and wait until every partition has a leader."""
        admin = self.admin()
        try:
            admin.create_topics(
                {name: {"num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}},
                timeout_ms=30000,
                wait_for_metadata=True,
            )
        finally:
            admin.close()

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str],
        key: bytes | str | None = None,
        partition: int | None = None,
    ) -> int:
        """Produce ``values`` (acks=all, idempotent order) and flush; returns the count sent.

        Raises if any record failed: tests must not proceed on partially written input.
        """
        from kafka import KafkaProducer

        def as_bytes(v: bytes | str | None) -> bytes | None:
            return v.encode() if isinstance(v, str) else v

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            linger_ms=5,
            retries=5,
            max_in_flight_requests_per_connection=1,  # keep send order on retries
            client_id="devstack-producer",
        )
        try:
            key_bytes = as_bytes(key)
            futures = [
                producer.send(topic, value=as_bytes(v), key=key_bytes, partition=partition) for v in values
            ]
            producer.flush(timeout=60)
            for fut in futures:
                fut.get(timeout=60)  # re-raises the send error, if any
            return len(futures)
        finally:
            producer.close(timeout=10)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Latest offset of each partition of ``topic`` (= records ever written, no compaction)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="devstack-offsets")
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise ServiceError(f"topic {topic!r} does not exist on {self.bootstrap}")
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
        finally:
            consumer.close()

    def consume_all(self, topic: str, timeout: float = 60.0) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """Read ``topic`` from the beginning up to its current end offsets.

        Returns (partition, offset, key, value) tuples. Stops exactly at the end offsets taken
        at call time, so the result is deterministic; fails if they are not reached in time.
        """
        from kafka import KafkaConsumer, TopicPartition

        ends = self.end_offsets(topic)
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id="devstack-reader",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        records: list[tuple[int, int, bytes | None, bytes | None]] = []
        try:
            tps = [TopicPartition(topic, p) for p in ends]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + timeout
            while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
                if time.monotonic() > deadline:
                    got = {tp.partition: consumer.position(tp) for tp in tps}
                    raise ServiceError(f"consume_all({topic!r}): reached {got}, expected {ends}")
                for tp, batch in consumer.poll(timeout_ms=500).items():
                    for rec in batch:
                        if rec.offset < ends[tp.partition]:
                            records.append((tp.partition, rec.offset, rec.key, rec.value))
            return records
        finally:
            consumer.close()
