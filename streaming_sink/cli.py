"""`streaming-sink`: the command line of the packaged job (the operator commands grow here)."""
from __future__ import annotations

import argparse
import sys

from . import job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streaming-sink", description="Exactly-once Kafka ingestion into OLAP databases")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the packaged Kafka ingestion job from a JSON spec")
    run.add_argument("--spec", required=True, help="path of the JSON job spec (see streaming_sink/job.py JobSpec)")
    args = parser.parse_args(argv)
    if args.command == "run":
        return job.main(["--spec", args.spec])
    return 2


if __name__ == "__main__":
    sys.exit(main())
