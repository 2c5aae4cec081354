"""A ClickHouse HTTP front over the real engine (chdb): a test double of the server the HTTP target talks to."""
from .server import ClickHouseFront, Fault, Faults

__all__ = ["ClickHouseFront", "Fault", "Faults"]
