"""A Spark standalone cluster on this machine: a master and one worker per loopback host.

Workers bound to 127.0.0.2 and 127.0.0.3 count as two hosts, so Spark places a speculative copy
of a task on the other host and losing an executor is real. Used by the cluster test and the soak.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.services._proc import wait_until
from tests.support.services.ports import free_port

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@contextlib.contextmanager
def standalone_cluster(work: Path, hosts: tuple[str, ...] = WORKER_HOSTS) -> Iterator[str]:
    """Yields the master URL; one worker per host, one core each. Everything is SIGKILLed on exit."""
    port = free_port()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    procs: list[subprocess.Popen] = []
    work.mkdir(parents=True, exist_ok=True)

    def launch(args: list[str], log: Path, **env_extra: str) -> None:
        with log.open("w") as out:  # the child keeps its own copy of the descriptor
            procs.append(subprocess.Popen([str(spark_class()), *args], env=dict(env, **env_extra), stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    try:
        master_log = work / "master.log"
        launch(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                "--webui-port", str(free_port())], master_log)
        url = f"spark://127.0.0.1:{port}"
        for host in hosts:
            worker_dir = work / f"worker-{host}"
            worker_dir.mkdir()
            launch(["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1", "--memory", "1g",
                    "--work-dir", str(worker_dir), "--webui-port", str(free_port()), url],
                   work / f"worker-{host}.log", SPARK_LOCAL_IP=host)

        def registered() -> bool:
            return master_log.read_text(errors="replace").count("Registering worker") >= len(hosts)

        wait_until(registered, timeout=120, what=f"{len(hosts)} Spark workers registering with {url}")
        yield url
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in executor_pids():  # executors run in the workers' sessions; be sure none outlives the cluster
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def executor_pids() -> list[int]:
    """The executor JVMs running on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if b"CoarseGrainedExecutorBackend" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return sorted(pids)
