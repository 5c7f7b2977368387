"""`kafka-scorer` command line: one subcommand per module, imported only when chosen.

Importing torch and transformers takes seconds; `--help` and `submit` should not pay for it, so each
subcommand lives in its own module that exposes `configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kafka_scorer import __version__
from kafka_scorer.config import DType, choices
from kafka_scorer.help_style import HelpFormatter

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("kafka_scorer.worker.command", "consume jobs from Kafka, score them, produce results"),
    "demo": ("kafka_scorer.demo", "run an embedded broker, a worker and sample jobs end to end"),
    "submit": ("kafka_scorer.submit", "produce jobs from JSON Lines and wait for their results"),
    "bench": ("kafka_scorer.bench.command", "measure engine and worker throughput side by side"),
    "broker": ("kafka_scorer.broker_command", "run the embedded Kafka-protocol broker until Ctrl-C"),
    "model": ("kafka_scorer.model_command", "write a small random model to serve (no model hub needed)"),
}


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device/--dtype for commands that load a model themselves (the worker reads them from Settings)."""
    parser.add_argument(
        "--device", default="auto", metavar="DEVICE", help="torch device: auto, cpu, cuda, cuda:1 ..."
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=choices(DType),
        help="weights and activations dtype; auto: bfloat16 on CUDA, float32 on CPU",
    )


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
    if args.command not in ("worker", "submit"):  # those two check after their own set-up
        from kafka_scorer.env_check import warn_unknown

        warn_unknown(f"kafka-scorer {args.command}", os.environ, sys.stderr)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
