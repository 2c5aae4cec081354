"""A real Kafka Connect worker (standalone) running the Debezium PostgreSQL connector, for the change-data tests.

The worker runs ``ConnectStandalone`` from the Maven Central jars of the test broker's Kafka version; Debezium is a
plugin of its own (jars.debezium_postgres_plugin) that the worker loads from its ``plugin.path`` in a class loader
of its own, so Debezium's libraries (Jackson, the PostgreSQL driver) never meet the worker's. Its source offsets
are a file in the worker's directory. Connectors are created over Connect's REST API on a free loopback port
(one worker can run several, e.g. with and without JSON schemas) and are ready when their task is RUNNING.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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
from tests.support.services.ports import free_port

HOST = "127.0.0.1"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"

#: JVM options: small heap, serial GC, C1 only: the worker's load is light and the machines have 2 shared cores.
DEFAULT_JVM_OPTS = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common=warn",
)

#: Log lines meaning the worker cannot start even though the JVM may still be running.
FATAL_LOG_MARKERS = ("Stopping due to error", "Address already in use", "Failed to start Connect")


class KafkaConnect(LocalService):
    """A standalone Connect worker in ``directory`` against the broker at ``bootstrap``.

    ``start()`` returns once the REST API answers; ``add_connector()`` once the connector's task runs. Use as a
    context manager or call ``stop()``; the JVM is also killed when this object is collected, when Python exits,
    and (setpriv's parent-death signal) when Python is killed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        bootstrap: str,
        *,
        version: str = jars.KAFKA_VERSION,
        debezium_version: str = jars.DEBEZIUM_VERSION,
        start_timeout: float = 90.0,
        jvm_opts: Iterable[str] = DEFAULT_JVM_OPTS,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.bootstrap = bootstrap
        self.version = version
        self.debezium_version = debezium_version
        self.start_timeout = start_timeout
        self.jvm_opts = list(jvm_opts)
        self.log_path = self.directory / "connect.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard: ProcessGuard | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServiceError("KafkaConnect is not started")
        return f"http://{HOST}:{self.port}"

    @property
    def offsets_path(self) -> Path:
        """The standalone worker's source offsets (where each connector's stream stands)."""
        return self.directory / "connect.offsets"

    def start(self) -> KafkaConnect:
        """Start the worker (same port and offsets on a restart) and wait until its REST API answers."""
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        classpath = os.pathsep.join(str(j) for j in jars.kafka_connect_jars(self.version))
        plugin_path = self._plugin_path()
        if self.port is None:
            self.port = free_port()
        properties = self._write_properties(plugin_path)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._proc = spawn(
            [java_executable(), *self.jvm_opts, "-cp", classpath,
             "org.apache.kafka.connect.cli.ConnectStandalone", str(properties)],
            log_path=self.log_path,
            cwd=self.directory,
            env=self._java_env(),
        )  # fmt: skip
        self._guard = ProcessGuard(self, self._proc)

        def alive() -> str | None:
            new_log = log_since(self.log_path, log_offset)
            for marker in FATAL_LOG_MARKERS:
                if marker in new_log:
                    return f"worker logged {marker!r}"
            return exit_problem(self._proc)

        try:
            wait_until(lambda: self._get("/connectors") is not None, timeout=self.start_timeout,
                       what=f"Kafka Connect REST API {self.url}", alive=alive)
        except ServiceError as exc:
            self.kill()
            raise ServiceError(f"Kafka Connect {self.version} did not start in {self.directory}: {exc}\n"
                               f"--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}") from None
        return self

    # -- connectors --------------------------------------------------------------------------

    def add_connector(self, name: str, config: Mapping[str, str], timeout: float = 90.0) -> None:
        """Create (or reconfigure) connector ``name`` and wait until it and its task are RUNNING."""
        self._request("PUT", f"/connectors/{name}/config", dict(config))
        self.wait_running(name, timeout)

    def wait_running(self, name: str, timeout: float = 90.0) -> None:
        """Wait until connector ``name`` and every task of it are RUNNING; a FAILED one fails at once with its trace."""

        def failed() -> str | None:
            status = self.status(name)
            if status is None:
                return exit_problem(self._proc)
            for part in [status.get("connector", {}), *status.get("tasks", [])]:
                if part.get("state") == "FAILED":
                    trace = str(part.get("trace", "")).splitlines()
                    return f"connector {name} FAILED: " + "\n".join(trace[:12])
            return exit_problem(self._proc)

        def running() -> bool:
            status = self.status(name) or {}
            tasks = status.get("tasks", [])
            return bool(tasks) and status.get("connector", {}).get("state") == "RUNNING" and all(
                task.get("state") == "RUNNING" for task in tasks
            )

        try:
            wait_until(running, timeout=timeout, what=f"connector {name} RUNNING", alive=failed)
        except ServiceError as exc:
            raise ServiceError(f"{exc}\n--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}") from None

    def config(self, name: str) -> dict[str, str]:
        """Connector ``name``'s configuration as the worker holds it (to create it again after a restart)."""
        config = self._get(f"/connectors/{name}/config")
        if config is None:
            raise ServiceError(f"Kafka Connect has no connector {name}")
        return {str(k): str(v) for k, v in config.items() if k != "name"}

    def status(self, name: str) -> dict[str, Any] | None:
        """Connect's status of connector ``name`` (None while the worker does not know it)."""
        status = self._get(f"/connectors/{name}/status")
        return dict(status) if status is not None else None

    def delete_connector(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}", None)

    # -- internals ---------------------------------------------------------------------------

    def _plugin_path(self) -> Path:
        # plugin.path names directories whose *children* are plugins; the cached Debezium jars sit in a Maven
        # repository layout (io/, org/, com/ ...), so they become one plugin through a link named after it.
        plugins = self.directory / "plugins"
        plugins.mkdir(exist_ok=True)
        link = plugins / "debezium-postgres"
        target = jars.debezium_postgres_plugin(self.debezium_version)
        if link.is_symlink() and Path(os.readlink(link)) != target:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)
        return plugins

    def _write_properties(self, plugin_path: Path) -> Path:
        props = {
            "bootstrap.servers": self.bootstrap,
            "listeners": f"http://{HOST}:{self.port}",
            "rest.advertised.host.name": HOST,
            "rest.advertised.port": str(self.port),
            "plugin.path": str(plugin_path),
            # Both the worker's converters and Debezium's connector ship ServiceLoader manifests: no class scan.
            "plugin.discovery": "service_load",
            "offset.storage.file.filename": str(self.offsets_path),
            "offset.flush.interval.ms": "1000",
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
        }
        path = self.directory / "worker.properties"
        path.write_text("".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items()))
        return path

    def _java_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "KAFKA_OPTS"):
            env.pop(key, None)
        return env

    def _get(self, path: str) -> Any:
        try:
            return self._request("GET", path, None)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _request(self, method: str, path: str, body: object) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "GET":
                raise
            detail = exc.read().decode(errors="replace")
            raise ServiceError(f"Kafka Connect {method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(text) if text else None


def debezium_postgres_config(
    database: Mapping[str, str],
    *,
    topic_prefix: str,
    slot_name: str,
    tables: Iterable[str],
    schemas_enable: bool = True,
    partitions: int = 1,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A Debezium PostgreSQL connector's configuration: pgoutput, its own slot and publication, JSON converters.

    ``database`` is PostgresServer.debezium_properties(); ``tables`` are schema-qualified (``public.customers``).
    Topics are ``<topic_prefix>.<schema>.<table>``, created by Connect with ``partitions`` partitions. The slot
    name is also the publication's: two connectors on one database must not share either.
    """
    schemas = "true" if schemas_enable else "false"
    config = {
        "connector.class": POSTGRES_CONNECTOR,
        "tasks.max": "1",
        **database,
        "plugin.name": "pgoutput",
        "topic.prefix": topic_prefix,
        "slot.name": slot_name,
        "publication.name": slot_name,
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(tables),
        "decimal.handling.mode": "string",
        "snapshot.mode": "initial",
        # Connect creates the topics (the test broker does not auto-create them).
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": str(partitions),
        "key.converter": JSON_CONVERTER,
        "value.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": schemas,
        "value.converter.schemas.enable": schemas,
    }
    config.update(extra or {})
    return config
