"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) for tests/demos.

Runs ``kafka.Kafka`` from the Maven Central jars (see :mod:`tests.support.services.jars`) on free loopback
ports, with its data and log in a directory the caller owns. Clients are kafka-python.

With ``security=SaslSsl(...)`` the broker also has a SASL_SSL client listener (users and
password, over TLS with a test CA made by the JDK's ``keytool`` at the first start), so the
product's secured-source configuration is tested against a real broker, not just parsed.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.services import jars
from tests.support.services._proc import (
    LocalService,
    ProcessGuard,
    ServiceError,
    exit_problem,
    java_executable,
    log_since,
    log_tail,
    spawn,
    wait_until,
)
from tests.support.services.ports import free_ports, port_accepts

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


#: SASL mechanisms :class:`SaslSsl` supports, with the JAAS login module a client names.
SASL_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

#: Name of the secured listener in server.properties (also its security protocol).
SECURE_LISTENER = "SASL_SSL"

_USER_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class SaslSsl:
    """A SASL_SSL client listener: ``users`` (name -> password) log in with ``mechanism``.

    SCRAM users are written into the metadata log at format time (StorageTool ``--add-scram``),
    PLAIN users into the listener's JAAS config. Names are restricted to ``[A-Za-z0-9_-]``
    and passwords may not contain ``,`` because neither format has an escape for them.
    """

    users: Mapping[str, str]
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        object.__setattr__(self, "users", dict(self.users))  # snapshot: written once, at format time
        if self.mechanism not in SASL_LOGIN_MODULES:
            raise ValueError(f"unsupported SASL mechanism {self.mechanism!r}: use {sorted(SASL_LOGIN_MODULES)}")
        if not self.users:
            raise ValueError("SaslSsl needs at least one user (the readiness probe logs in as the first)")
        for name, password in self.users.items():
            if not _USER_NAME.fullmatch(name):
                raise ValueError(f"SASL user name {name!r} must match {_USER_NAME.pattern}")
            if not password or "," in password:
                raise ValueError(f"password of SASL user {name!r} must be non-empty and contain no ','")


def _jaas_quote(value: str) -> str:
    """A JAAS option value: double-quoted, with backslash and quote escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _cluster_id() -> str:
    """A Kafka-style cluster id: URL-safe base64 of a random UUID, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaBroker(LocalService):
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
        security: SaslSsl | None = None,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.version = version
        self.start_timeout = start_timeout
        self.auto_create_topics = auto_create_topics
        self.extra_properties = dict(extra_properties or {})
        self.jvm_opts = list(jvm_opts)
        self.log_path = self.directory / "kafka.log"
        self.security = security
        self.port: int | None = None
        self.controller_port: int | None = None
        self.secure_port: int | None = None
        # Random per broker object; the keystore it protects is made once, at the first start.
        self._store_password = secrets.token_urlsafe(18)
        self._tls_ready = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard: ProcessGuard | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers`` / ``kafka.bootstrap.servers``."""
        if self.port is None:
            raise ServiceError("KafkaBroker is not started")
        return f"{HOST}:{self.port}"

    def _security(self) -> SaslSsl:
        if self.security is None:
            raise ServiceError("KafkaBroker has no SASL_SSL listener (pass security=SaslSsl(...))")
        return self.security

    @property
    def secure_bootstrap(self) -> str:
        """``host:port`` of the SASL_SSL listener (brokers built with ``security=``)."""
        self._security()
        if self.secure_port is None:
            raise ServiceError("KafkaBroker is not started")
        return f"{HOST}:{self.secure_port}"

    def start(self) -> KafkaBroker:
        """Start the broker and wait until it answers metadata requests.

        The first start picks free ports and formats fresh storage (and, with ``security``,
        makes the test CA and keystore); later starts (after ``stop()``/``kill()``) reuse the
        same ports, data and certificates, like a restarted server. With ``security`` it also
        waits until a configured user can log in over SASL_SSL.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        classpath = jars.kafka_broker_classpath(self.version)
        if self.security is not None and not self._tls_ready:
            self._make_tls_material()
        fresh = self.port is None
        attempts = 3 if fresh else 1
        for attempt in range(1, attempts + 1):
            if fresh:
                # Ports are free when chosen but released before Kafka binds them; on the rare
                # clash (another process took one in between) start again on fresh ports.
                if self.security is None:
                    self.port, self.controller_port = free_ports(2)
                else:
                    self.port, self.controller_port, self.secure_port = free_ports(3)
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
                    self.port = self.controller_port = self.secure_port = None  # next start() formats afresh
                raise ServiceError(
                    f"Kafka {self.version} broker did not start in {self.directory}: {exc}\n"
                    f"--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
                ) from None
        raise AssertionError("unreachable")

    def restart(self) -> KafkaBroker:
        """Stop (controlled shutdown) and start again on the same ports with the same data."""
        self.stop()
        return self.start()

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
        listeners = [f"PLAINTEXT://{HOST}:{self.port}"]
        if self.security is not None:
            listeners.append(f"{SECURE_LISTENER}://{HOST}:{self.secure_port}")
        protocol_map = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        if self.security is not None:
            protocol_map += f",{SECURE_LISTENER}:SASL_SSL"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": ",".join([*listeners, f"CONTROLLER://{HOST}:{self.controller_port}"]),
            "advertised.listeners": ",".join(listeners),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocol_map,
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
        props.update(self._secure_listener_properties())
        props.update(self.extra_properties)
        path = self.properties_path
        # java.util.Properties reads backslash as an escape (a JAAS value may hold one).
        path.write_text("".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items()))
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
        if self.security is not None and self.security.mechanism.startswith("SCRAM-"):
            # Quoted values: StorageTool strips one pair of quotes, so a password may hold '"'.
            for name, password in self.security.users.items():
                argv += ["--add-scram", f'{self.security.mechanism}=[name={name},password="{password}"]']
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
        if self.security is None:
            return

        # The SASL_SSL listener binds with the others, but only a full TLS handshake plus login
        # shows that the keystore loaded and the credentials are known to this broker.
        user, password = next(iter(self.security.users.items()))

        def secure_ready() -> bool:
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(
                **self.kafka_python_settings(user, password),
                client_id="devstack-secure-probe",
                request_timeout_ms=3000,
                bootstrap_timeout_ms=3000,
            )
            try:
                admin.list_topics()
                return True
            finally:
                admin.close()

        what = f"Kafka SASL_SSL listener {self.secure_bootstrap}"
        wait_until(secure_ready, timeout=self.start_timeout, what=what, alive=alive)

    # -- SASL_SSL ----------------------------------------------------------------------------

    @property
    def tls_dir(self) -> Path:
        return self.directory / "tls"

    @property
    def keystore_path(self) -> Path:
        """The broker's PKCS12 keystore: its key and the CA-signed certificate chain."""
        return self.tls_dir / "broker.p12"

    @property
    def ca_pem_path(self) -> Path:
        """The test CA's certificate (PEM) that clients must trust to reach the SASL_SSL listener."""
        self._security()
        if not self._tls_ready:
            raise ServiceError("KafkaBroker is not started (the CA is made at the first start)")
        return self.tls_dir / "ca.pem"

    def _keytool(self, *args: str) -> None:
        java = Path(java_executable()).resolve()
        keytool = java.parent / "keytool"
        exe = str(keytool) if keytool.is_file() else shutil.which("keytool")
        if not exe:
            raise ServiceError(f"keytool not found next to {java} nor on PATH")
        # Each call is a short JVM: C1 only and a small heap keep the 2 cores free.
        argv = [exe, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-J-Xmx64m", *args]
        proc = subprocess.run(
            argv, cwd=self.tls_dir, env=self._java_env(), capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise ServiceError(f"keytool {args[0]} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def _make_tls_material(self) -> None:
        """A fresh test CA and a broker key pair it signs (SAN 127.0.0.1/localhost), in tls_dir.

        Done once per broker object: restarts reuse it, like a real server's certificate.
        """
        shutil.rmtree(self.tls_dir, ignore_errors=True)
        self.tls_dir.mkdir(parents=True)
        pw = self._store_password
        ca_store = ["-keystore", "ca.p12", "-storetype", "PKCS12", "-storepass", pw]
        broker_store = ["-keystore", self.keystore_path.name, "-storetype", "PKCS12", "-storepass", pw]
        # EC keys: generated and used in handshakes far faster than RSA on a small machine.
        key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", "3650"]
        self._keytool(
            "-genkeypair", "-alias", "ca", *key, *ca_store,
            "-dname", "CN=streaming-sink devstack test CA",
            "-ext", "BasicConstraints:critical=ca:true,pathlen:0",
            "-ext", "KeyUsage:critical=keyCertSign,cRLSign",
        )  # fmt: skip
        self._keytool("-exportcert", "-alias", "ca", *ca_store, "-rfc", "-file", "ca.pem")
        self._keytool("-genkeypair", "-alias", "broker", *key, *broker_store, "-dname", "CN=localhost")
        self._keytool("-certreq", "-alias", "broker", *broker_store, "-file", "broker.csr")
        self._keytool(
            "-gencert", "-alias", "ca", *ca_store,
            "-infile", "broker.csr", "-outfile", "broker.pem", "-rfc",
            "-startdate", "-1d", "-validity", "3650",
            "-ext", f"SubjectAlternativeName=IP:{HOST},DNS:localhost",
            "-ext", "KeyUsage:critical=digitalSignature",
            "-ext", "ExtendedKeyUsage=serverAuth",
        )  # fmt: skip
        # The reply as a full chain (broker, CA): keytool installs it without a trusted CA entry
        # (-noprompt accepts the unknown root), and the broker then presents both certificates.
        chain = self.tls_dir / "broker-chain.pem"
        chain.write_text((self.tls_dir / "broker.pem").read_text() + (self.tls_dir / "ca.pem").read_text())
        self._keytool("-importcert", "-alias", "broker", *broker_store, "-file", chain.name, "-noprompt")
        self._tls_ready = True

    def _secure_listener_properties(self) -> dict[str, str]:
        if self.security is None:
            return {}
        prefix = f"listener.name.{SECURE_LISTENER.lower()}."
        mechanism = self.security.mechanism
        module = SASL_LOGIN_MODULES[mechanism]
        if mechanism == "PLAIN":
            # The broker's PLAIN login module checks clients against its user_<name> options.
            options = "".join(f" user_{n}={_jaas_quote(p)}" for n, p in self.security.users.items())
        else:
            options = ""  # SCRAM credentials live in the metadata log (StorageTool --add-scram)
        return {
            prefix + "sasl.enabled.mechanisms": mechanism,
            f"{prefix}{mechanism.lower()}.sasl.jaas.config": f"{module} required{options};",
            prefix + "ssl.keystore.type": "PKCS12",
            prefix + "ssl.keystore.location": str(self.keystore_path),
            prefix + "ssl.keystore.password": self._store_password,
            prefix + "ssl.key.password": self._store_password,
        }

    # -- clients -----------------------------------------------------------------------------

    def spark_kafka_options(self, user: str, password: str) -> dict[str, str]:
        """Spark Kafka source/sink options for the SASL_SSL listener, as a user would write them.

        Hostname verification stays on (the certificate's SAN names 127.0.0.1), and the CA is
        trusted as a PEM file, with no JKS truststore to make.
        """
        mechanism = self._security().mechanism
        return {
            "kafka.bootstrap.servers": self.secure_bootstrap,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": mechanism,
            "kafka.sasl.jaas.config": (
                f"{SASL_LOGIN_MODULES[mechanism]} required"
                f" username={_jaas_quote(user)} password={_jaas_quote(password)};"
            ),
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": str(self.ca_pem_path),
        }

    def kafka_python_settings(self, user: str, password: str) -> dict[str, object]:
        """kafka-python client kwargs (incl. ``bootstrap_servers``) for the SASL_SSL listener.

        kafka-python takes the user and password as ``sasl_plain_*`` for SCRAM as well.
        """
        return {
            "bootstrap_servers": self.secure_bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": self._security().mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": password,
            "ssl_cafile": str(self.ca_pem_path),
        }

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
