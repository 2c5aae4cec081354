"""Per-batch figures as Prometheus text on a small HTTP endpoint in the driver (`/metrics`).

The sink logs one structured line per batch; this serves the same figures, summed over the
driver's life, for a scraper. Counters restart with the driver, as Prometheus expects.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sink import BatchReport


class BatchMetrics:
    """Accumulates BatchReports; `render()` is the Prometheus exposition text."""

    def __init__(self, job_id: str) -> None:
        self._job = job_id
        self._lock = threading.Lock()
        self._batches: dict[str, int] = {}
        self._rows: dict[str, int] = {}
        self._totals = {"records_in": 0, "dead_letters": 0, "transactions": 0, "replayed": 0, "bytes": 0}
        self._last_batch = -1
        self._last_timings: dict[str, float] = {}

    def record(self, report: "BatchReport") -> None:
        with self._lock:
            self._batches[report.action] = self._batches.get(report.action, 0) + 1
            for table, rows in (report.rows_by_table or {}).items():
                self._rows[table] = self._rows.get(table, 0) + rows
            for key in self._totals:
                self._totals[key] += int(getattr(report, key))
            self._last_batch = max(self._last_batch, report.batch_id)
            self._last_timings = dict(report.timings or {})

    def render(self) -> str:
        job = f'job="{self._job}"'
        with self._lock:
            lines = ["# TYPE streaming_sink_batches_total counter"]
            lines += [f'streaming_sink_batches_total{{{job},action="{a}"}} {n}' for a, n in sorted(self._batches.items())]
            lines.append("# TYPE streaming_sink_rows_total counter")
            lines += [f'streaming_sink_rows_total{{{job},table="{t}"}} {n}' for t, n in sorted(self._rows.items())]
            for key, value in self._totals.items():
                lines += [f"# TYPE streaming_sink_{key}_total counter", f"streaming_sink_{key}_total{{{job}}} {value}"]
            lines += ["# TYPE streaming_sink_last_batch_id gauge", f"streaming_sink_last_batch_id{{{job}}} {self._last_batch}"]
            lines.append("# TYPE streaming_sink_last_phase_seconds gauge")
            lines += [
                f'streaming_sink_last_phase_seconds{{{job},phase="{k.removesuffix("_s")}"}} {v:.6f}'
                for k, v in sorted(self._last_timings.items()) if k.endswith("_s")
            ]
        return "\n".join(lines) + "\n"


def serve_metrics(metrics: BatchMetrics, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; `server.server_address` tells the port (0 = any free one)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if self.path != "/metrics":
                self.send_error(404, "only /metrics here")
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            """Scrapes are not worth a log line each."""

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="streaming-sink-metrics", daemon=True).start()
    return server
