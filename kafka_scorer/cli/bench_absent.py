"""`kafka-scorer bench` where the bench is not there: one line saying where it lives.

The bench is developer tooling beside the product (`kafka_scorer_bench/` in the repository), kept out of
the wheel so that an installed worker carries no benchmark code. `cli/main.py` dispatches `bench` to the
bench's own command module when it can be imported (a checkout: `./dev run bench`, `./dev test`, or
`python -m kafka_scorer` from its root) and to this stand-in otherwise, so the command neither vanishes
from `--help` nor fails with a traceback.
"""

from __future__ import annotations

import argparse
import sys

MESSAGE = (
    "kafka-scorer bench: the bench is not installed (it is not part of the kafka-scorer wheel); "
    "from a checkout of the repository run `./dev run bench ARGS`"
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Any arguments are taken (`takes_any`): they are the bench's, and the answer is the same for all."""
    parser.description = MESSAGE
    parser.set_defaults(takes_any=True)


def run(args: argparse.Namespace) -> int:
    print(MESSAGE, file=sys.stderr)
    return 2
