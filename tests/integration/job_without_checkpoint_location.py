"""The packaged job with its sink built as a user's own pipeline builds it: no `checkpoint_location`, so the
sink must find the streaming checkpoint from Spark (and keep its marker there) by itself."""
from __future__ import annotations

import sys

from streaming_sink import job
from streaming_sink.job_spec import JobSpec
from streaming_sink.sink import ExactlyOnceSink

_build_sink = job.build_sink


def build_sink(spec: JobSpec) -> ExactlyOnceSink:
    sink = _build_sink(spec)
    sink.checkpoint_location = None
    return sink


if __name__ == "__main__":
    job.build_sink = build_sink
    sys.exit(job.main())
