"""Benchmarks of the sink against Spark's own sinks, side by side in one run (`bash scripts/bench.sh`; see bench/README.md)."""
