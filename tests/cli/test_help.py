"""`--help` for the program and every subcommand: exit 0, usage line, the flags a user looks for.

Run as child processes so a subcommand module that fails to import, or a flag that argparse cannot
format, fails here instead of in front of a user.
"""

from __future__ import annotations

import pytest

from kafka_scorer.cli import SUBCOMMANDS
from tests.cli.helpers import run_cli

KEY_FLAGS = {
    "worker": ["--bootstrap-servers", "--model", "--request-topics", "--reply-topic", "--max-batch-tokens"],
    "demo": ["--model", "--jobs", "--short", "--device"],
    "submit": [
        "--timeout",
        "--format",
        "--output",
        "--bootstrap-servers",
        "--request-topic",
        "--reply-topic",
    ],
    "bench": ["--device"],
    "broker": ["--port", "--topic", "--partitions"],
    "model": ["causal", "classification", "--seed"],
}


def test_program_help_lists_every_subcommand() -> None:
    done = run_cli("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kafka-scorer")
    for name in SUBCOMMANDS:
        assert name in done.stdout


def test_every_subcommand_has_key_flags_listed() -> None:
    assert set(KEY_FLAGS) == set(SUBCOMMANDS), "a new subcommand needs its key flags listed here"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_subcommand_help(name: str) -> None:
    done = run_cli(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: kafka-scorer {name}")
    for flag in KEY_FLAGS[name]:
        assert flag in done.stdout, f"{name} --help does not mention {flag}"
    assert "Traceback" not in done.stderr


def test_no_subcommand_is_a_usage_error() -> None:
    done = run_cli()
    assert done.returncode == 2
    assert "usage: kafka-scorer" in done.stderr


def test_version_names_the_installed_package() -> None:
    from importlib.metadata import version

    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"kafka-scorer {version('kafka-scorer')}"
