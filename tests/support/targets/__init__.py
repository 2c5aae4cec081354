"""One adapter class per target (`<product>.py`): how the end-to-end pipeline sets the target up, reads and inspects
it (`tests.support.pipeline.TargetAdapter`), and how the crash matrix drives it (`base.CrashTarget`).

A target's hooked variant (its transactions obeying the task hooks of `hooks.py`) registers through
`streaming_sink.targets.register(descriptor)` in the driver child (`tests.support.targets.driver`), never by
monkeypatching a factory. Adding a target to the crash matrix is its adapter module and one line in `ADAPTERS`.
"""
