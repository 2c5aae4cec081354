"""Real local services for tests and demos: Kafka (KRaft), Redis, and a local Spark conf.

Everything here runs on one machine without Docker: the Kafka broker and Spark's Kafka source
come as jars from Maven Central (cached under ``~/.cache/streaming-sink/jars``), Redis is the
distribution's ``redis-server``. Nothing in this package is used by the product at runtime.
"""

from __future__ import annotations

__all__ = ["KafkaBroker", "RedisServer"]


def __getattr__(name: str) -> object:
    # Lazy so that `import tests.support.services.jars` (used by scripts/setup.sh before kafka-python or
    # redis-py are importable) does not pull in the client libraries.
    if name == "KafkaBroker":
        from tests.support.services.kafka import KafkaBroker

        return KafkaBroker
    if name == "RedisServer":
        from tests.support.services.redis import RedisServer

        return RedisServer
    raise AttributeError(name)
