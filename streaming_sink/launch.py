"""The packaged job as a file for `spark-submit`, which runs a Python file rather than a module:
`spark-submit [options] <path of this file> --config job.toml` is `streaming-sink run --config job.toml`.

spark-submit puts the file's own folder first on `sys.path`; this package's modules there would
shadow the standard library's (its `http` hides `http.client`), so that entry goes before any import.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from streaming_sink.cli import main  # noqa: E402  (after the path fix above)

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
