"""Test-only driver entry: the packaged job with the hooked ClickHouse target (see clickhouse_http_harness)."""
import sys

from streaming_sink import job
from tests.integration.clickhouse_http_harness import hooked_target_from_url

if __name__ == "__main__":
    job.target_from_url = hooked_target_from_url
    sys.exit(job.main())
