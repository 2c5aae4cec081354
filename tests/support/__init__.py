"""Test support, in one place: what tests, the demo, the soak and the bench start and share.

* `services/`: real local services without Docker (Kafka, Redis, Spark's jars and cluster, free ports);
* `pipeline.py`: Kafka -> the packaged job in a child process -> a target, verified row by row;
* `jobs.py`: `job_toml(**overrides)`, the one writer of job.toml text, and `ConfigJob` (the demo job);
* `targets/<product>.py`: one adapter per target, for the pipeline and the crash matrix alike;
* `real_cluster.py`: the MySQL-protocol base of the real StarRocks and Doris (tests/docker);
* `doubles/`: the Stream Load emulators, the ClickHouse HTTP front, the recording target;
* `fixtures.py`: every shared pytest fixture (tests/conftest.py imports this one module).

Nothing here is imported by the product (streaming_sink/, state/); importing a module here starts nothing.
"""
