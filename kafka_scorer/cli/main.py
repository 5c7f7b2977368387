"""`kafka-scorer` command line: one subcommand per module, imported only when chosen.

Importing torch and transformers takes seconds; `--help` and `submit` should not pay for it, so each
subcommand lives in its own module that exposes `configure(parser)` and `run(args) -> int`.

`bench` is the one command whose module is not in the package: the bench lives beside the product, outside
the wheel (`kafka_scorer_bench/`). It is named here as a string, never imported by the package itself;
where it cannot be imported (an installed wheel), `cli/bench_absent.py` answers in its place.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from kafka_scorer import __version__
from kafka_scorer.cli.help_style import HelpFormatter

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("kafka_scorer.cli.worker", "consume jobs from Kafka, score them, produce results"),
    "demo": ("kafka_scorer.cli.demo", "run an embedded broker, a worker and sample jobs end to end"),
    "submit": ("kafka_scorer.cli.submit", "produce jobs from JSON Lines and wait for their results"),
    "bench": (
        "kafka_scorer_bench.command",
        "measure engine and worker throughput side by side (checkout only)",
    ),
    "broker": ("kafka_scorer.cli.broker", "run the embedded Kafka-protocol broker until Ctrl-C"),
    "model": ("kafka_scorer.cli.model", "write a small random model to serve (no model hub needed)"),
}

STAND_INS = {"kafka_scorer_bench.command": "kafka_scorer.cli.bench_absent"}
"""A command module outside the wheel, and what answers where it is absent."""


def command_module(module_name: str) -> ModuleType:
    """The subcommand's module, or its stand-in when the package it lives in is not there at all (a
    module that is there but fails to import raises, as any other would)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        if module_name not in STAND_INS or missing.name != module_name.partition(".")[0]:
            raise
        return importlib.import_module(STAND_INS[module_name])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-scorer",
        description="Score LLM jobs from Kafka: CausalLM label probabilities, classification logits, "
        "multi-item scoring.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = command_module(module_name)
        module.configure(
            sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any", False):  # what parse_args does, but for a stand-in
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command not in ("worker", "submit"):  # those two check after their own set-up
        from kafka_scorer.env_check import warn_unknown

        warn_unknown(f"kafka-scorer {args.command}", os.environ, sys.stderr)
    module = command_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
