"""One adapter class per target (`<product>.py`, on `base.TargetAdapter`): how the end-to-end pipeline
(tests/support/pipeline.py) sets the target up, reads and inspects it, and how the crash matrix
(tests/integration/test_exactly_once_matrix.py) drives it.

A target's hooked variant (its transactions obeying the task hooks of tests/support/crash.py) is a descriptor, its
module's `HOOKED`, which the driver child registers through `streaming_sink.targets.register(descriptor)`
(`python -m tests.support.crash`, chosen by the adapter's `hooked_module`), never by monkeypatching a factory.
Adding a target to the crash matrix is its adapter module and one line in the matrix's `TARGETS`.
"""
