"""`--help` for the program and every subcommand: exit 0, usage line, the flags a user looks for.

Run as child processes so a subcommand module that fails to import, or a flag that argparse cannot
format, fails here instead of in front of a user.
"""

from __future__ import annotations

import argparse

import pytest

from kafka_scorer.cli.main import SUBCOMMANDS, build_parser
from kafka_scorer.config import Settings
from tests.cli.helpers import cli_env, run_cli

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


READS_SETTINGS = {"worker", "submit"}
"""Subcommands that read KAFKA_SCORER_* and .env (the demo, bench, broker and model deliberately do not)."""


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_option_shows_its_default_choices_and_env_var(name: str) -> None:
    """The worker's style everywhere: `(default: ...)`, the choices in the usage, `env: KAFKA_SCORER_*`
    for a flag over a setting the command reads; each flag's help must appear in the printed text."""
    parser = _subparsers()[name]
    printed = " ".join(run_cli(name, "--help", env=cli_env(COLUMNS="1000")).stdout.split())
    for action in _options(parser):
        flag = max(action.option_strings, key=len)
        described = " ".join(parser._get_formatter()._expand_help(action).split())
        assert described in printed, f"{name} {flag}: help not printed as formatted"
        assert "(default:" in described, f"{name} {flag}: no default shown: {described!r}"
        if action.choices:
            usage = "{" + ",".join(map(str, action.choices)) + "}"
            assert usage in printed, f"{name} {flag}: choices {usage} not shown"
        if name in READS_SETTINGS and action.dest in Settings.model_fields:
            assert f"env: KAFKA_SCORER_{action.dest.upper()}" in described, f"{name} {flag}: no env var"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_env_file_exactly_where_settings_are_read(name: str) -> None:
    flags = {s for a in _options(_subparsers()[name]) for s in a.option_strings}
    assert ("--env-file" in flags) == (name in READS_SETTINGS)


def test_submit_reads_the_env_file_it_is_given(tmp_path) -> None:
    """The file named by --env-file is read (a bad value in it is reported by setting and exit 2),
    and the default `.env` of the working directory is not read instead."""
    env_file = tmp_path / "cluster.env"
    env_file.write_text("KAFKA_SCORER_BOOTSTRAP_SERVERS=no-port-here:\n")
    done = run_cli("submit", "--env-file", str(env_file), "--timeout", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "bootstrap_servers" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
