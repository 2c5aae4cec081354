"""Deterministic simulation of the sink's protocol (no Spark): see harness.py."""
