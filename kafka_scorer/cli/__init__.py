"""Every `kafka-scorer` subcommand, one module each (main.py dispatches), plus what they share: help
formatting (help_style.py) and result rendering for people (result_view.py)."""

from kafka_scorer.cli.main import main

__all__ = ["main"]
