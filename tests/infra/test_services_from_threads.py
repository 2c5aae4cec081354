"""A service the tests start again from a background thread must outlive that thread.

The failover tests restart a killed Redis master from a background thread while the job goes on in the main one.
`spawn` used to ask the kernel to kill the child when the thread that started it exits (PR_SET_PDEATHSIG is per
thread): the rejoined master died the moment its thread finished, and every journal write after that waited for a
replica that was gone (test_redis_ride_through.py failed that way in CI, after its 120 s bound).
"""
from __future__ import annotations

import threading
from pathlib import Path

from tests.support.services._proc import wait_until
from tests.support.services.redis import RedisServer


def _thread_gone(native_id: int) -> bool:
    return not Path(f"/proc/self/task/{native_id}").exists()


def test_a_server_started_again_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        server.kill()
        thread = threading.Thread(target=server.start)
        thread.start()
        thread.join()
        native_id = thread.native_id
        assert native_id is not None
        wait_until(lambda: _thread_gone(native_id), timeout=10, what="the starting thread to be gone")
        with server.client() as client:
            assert client.ping()
        assert server.running
