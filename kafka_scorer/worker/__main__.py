"""`python -m kafka_scorer.worker ...`: the worker subcommand alone, same flags as `kafka-scorer worker`."""

import argparse
import sys

from kafka_scorer.worker import command

parser = argparse.ArgumentParser(prog="python -m kafka_scorer.worker", description=command.__doc__)
command.configure(parser)
sys.exit(command.run(parser.parse_args()))
