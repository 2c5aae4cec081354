"""The intent gate is one rule written twice: `labels.gate_admits` (Python, for the file and memory stores) and the
Lua the Redis store runs inside Redis (`state/redis.py`), which cannot import Python. Both answer every case alike."""
from __future__ import annotations

import itertools
import json

import pytest
import redis

from streaming_sink.labels import GATE_OPEN, GATE_SEALED, Attempt, gate_admits, pass_prefix, replay_gate
from streaming_sink.state.redis import _FENCED_SCRIPT

GATES = [GATE_OPEN, GATE_SEALED, replay_gate(None), replay_gate(pass_prefix(3, 1)), replay_gate(pass_prefix(3, 10)),
         "PREPARED", "garbage"]
ATTEMPTS = [str(Attempt(3, 1, 0)), str(Attempt(3, 10, 5)), str(Attempt(3, 1, 17)), str(Attempt(4, 1, 0)),
            pass_prefix(3, 1), "e3w1x", "e3w1t", "", "e3w1t0count"]


@pytest.fixture
def client(redis_server):
    connection = redis.Redis.from_url(redis_server.url)
    connection.set("epoch", "7")
    yield connection
    connection.close()


def lua_admits(client: redis.Redis, gate: str, attempt: str) -> bool:
    client.set("gate", gate)
    try:
        client.eval(_FENCED_SCRIPT, 1, "epoch", "7", json.dumps([["SET", "written", attempt]]), "gate", attempt, "", "")
    except redis.ResponseError as refused:
        assert str(refused).startswith("SEALED"), refused
        return False
    return True


def test_the_lua_gate_answers_every_case_as_the_python_rule(client):
    answers = {(gate, attempt): lua_admits(client, gate, attempt) for gate, attempt in itertools.product(GATES, ATTEMPTS)}
    assert answers == {(gate, attempt): gate_admits(gate, attempt) for gate, attempt in answers}
    assert any(answers.values()) and not all(answers.values()), "the table has cases of both answers"
