"""`kafka-scorer` command line: one subcommand per module, imported only when chosen.

Importing torch and transformers takes seconds; `--help` and `submit` should not pay for it, so each
subcommand lives in its own module that exposes `configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kafka_scorer import __version__
from kafka_scorer.cli.help_style import HelpFormatter

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("kafka_scorer.cli.worker", "consume jobs from Kafka, score them, produce results"),
    "demo": ("kafka_scorer.cli.demo", "run an embedded broker, a worker and sample jobs end to end"),
    "submit": ("kafka_scorer.cli.submit", "produce jobs from JSON Lines and wait for their results"),
    "bench": ("kafka_scorer.cli.bench", "measure engine and worker throughput side by side"),
    "broker": ("kafka_scorer.cli.broker", "run the embedded Kafka-protocol broker until Ctrl-C"),
    "model": ("kafka_scorer.cli.model", "write a small random model to serve (no model hub needed)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-scorer",
        description="Score LLM jobs from Kafka: CausalLM label probabilities, classification logits, "
        "multi-item scoring.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.configure(
            sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
