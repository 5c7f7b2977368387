"""Every `kafka-scorer` subcommand, one module each (main.py dispatches), plus what they share: help
formatting (help_style.py), result rendering for people (result_view.py) and the check of where
`--model` points (model_source.py)."""

from kafka_scorer.cli.main import main

__all__ = ["main"]
