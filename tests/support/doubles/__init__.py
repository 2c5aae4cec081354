"""Test doubles: the StarRocks and Doris Stream Load emulators (`emulators/`), ClickHouse's HTTP interface over the
real engine (`clickhouse_front/`), and a target that records what the coordinator sends (`recording.py`). Their own
tests are in tests/doubles/ (and tests/infra/test_clickhouse_front.py)."""
