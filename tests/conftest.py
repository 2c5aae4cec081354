"""Shared fixtures: real local services (Kafka, Redis) come from tests/infra/fixtures.py."""
from tests.infra.fixtures import *  # noqa: F401,F403
from tests.clickhouse_front.fixtures import *  # noqa: F401,F403
