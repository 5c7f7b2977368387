"""The configuration reference is generated from the settings model and must not drift from it.

When `test_committed_page_matches_the_settings_model` fails, the fix is to regenerate the page:
`python -m kafka_scorer.config_docs > docs/configuration.md`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import SecretStr

from kafka_scorer.config import Settings
from kafka_scorer.config_docs import cli_flag, env_var, render

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process environment; one set on the CI host must not leak in."""
    for key in [k for k in os.environ if k.upper().startswith("KAFKA_SCORER_")]:
        monkeypatch.delenv(key)


def _table_rows(page: str) -> dict[str, list[str]]:
    """Setting name -> its row's cells, parsed back out of the Markdown."""
    rows: dict[str, list[str]] = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_committed_page_matches_the_settings_model() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run `python -m kafka_scorer.config_docs > docs/configuration.md`"
    )


def test_every_setting_has_exactly_one_row() -> None:
    rows = _table_rows(render())
    assert sorted(rows) == sorted(Settings.model_fields)


def _sample(name: str) -> tuple[str, object]:
    """A raw environment value for a field and what it must parse to; never the default, so that a
    variable that is silently ignored cannot pass."""
    field = Settings.model_fields[name]
    annotation, default = field.annotation, Settings.model_fields[name].get_default(call_default_factory=True)
    if type(None) in typing.get_args(annotation):  # X | None
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        choice = next(v for v in typing.get_args(annotation) if v != default)
        return str(choice), choice
    if annotation is bool:
        return ("false", False) if default else ("true", True)
    if annotation is int:
        value = (default or 0) + 1
        return str(value), value
    if annotation is float:
        value = (default or 0.0) + 0.5
        return str(value), value
    if typing.get_origin(annotation) is list:
        return "a,b", ["a", "b"]
    if name == "bootstrap_servers":  # validated as HOST:PORT list
        return "x-value:9093", "x-value:9093"
    if name == "topic_priorities":  # TOPIC=N pairs
        return "x-value=3", {"x-value": 3}
    if name == "template":  # validated against the presets and the disk
        return "qwen3-reranker", "qwen3-reranker"
    if name == "chunking":  # validated as the job field's JSON object
        return '{"aggregate": "mean"}', '{"aggregate": "mean"}'
    return "x-value", "x-value"


def _companions(name: str, tmp_path: Path) -> dict[str, str]:
    """TLS and SASL settings are checked against the protocol and the disk: give them what they need."""
    pem = tmp_path / "x.pem"
    pem.write_text("pem")
    if name.startswith("ssl_"):
        return {"security_protocol": "SSL", "ssl_certfile": str(pem), name: str(pem)}
    if name.startswith("sasl_"):
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "u",
            "sasl_password": "p",
        }
    return {}


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_documented_env_var_is_the_one_settings_reads(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Feed each documented variable to pydantic-settings and check it lands in that very field."""
    raw, expected = _sample(name)
    companions = _companions(name, tmp_path)
    if name.startswith("ssl_"):
        raw = expected = companions[name]
    monkeypatch.chdir(ROOT / "tests")  # no stray .env file
    for other, value in companions.items():
        monkeypatch.setenv(env_var(other), value)
    monkeypatch.setenv(env_var(name), raw)
    value = getattr(Settings(), name)
    assert (value.get_secret_value() if isinstance(value, SecretStr) else value) == expected


def test_rows_show_name_flag_and_default() -> None:
    rows = _table_rows(render())
    defaults = Settings()
    cells = rows["max_batch_tokens"]
    assert cells[1] == "`KAFKA_SCORER_MAX_BATCH_TOKENS`"
    assert cells[2] == f"`{cli_flag('max_batch_tokens')}`" == "`--max-batch-tokens`"
    assert cells[4] == f"`{defaults.max_batch_tokens}`"
    assert cells[5] == Settings.model_fields["max_batch_tokens"].description
    assert rows["request_topics"][4] == "`" + ",".join(defaults.request_topics) + "`"
    assert rows["dead_letter_topic"][4] == "unset"
    assert "`float16`" in rows["dtype"][3]
    assert rows["trust_remote_code"][2] == "`--trust-remote-code`, `--no-trust-remote-code`"


def test_module_runs_as_a_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kafka_scorer.config_docs"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout == render()


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_documented_flags_are_the_ones_the_worker_cli_accepts(name: str) -> None:
    """The flag column is rendered independently of the CLI; parse each documented flag for real."""
    from kafka_scorer.cli.worker import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    flags = re.findall(r"`(--[a-z0-9-]+)`", _table_rows(render())[name][2])
    raw, _ = _sample(name)
    if Settings.model_fields[name].annotation is bool:
        on, off = flags
        assert getattr(parser.parse_args([on]), name) is True
        assert getattr(parser.parse_args([off]), name) is False
    else:
        (flag,) = flags
        assert getattr(parser.parse_args([flag, raw]), name) == raw


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_the_page_and_help_show_the_same_default(name: str) -> None:
    """Issue 26: `--help` said `unset` where the page said `empty`, and `{}` for a mapping. One wording
    for both (booleans aside: `on`/`off` on a flag, `true`/`false` in a variable)."""
    from kafka_scorer.cli.help_style import setting_help

    field = Settings.model_fields[name]
    if field.annotation is bool:
        return
    page = _table_rows(render())[name][4].strip("`")
    help_default = re.search(r"\(default: (.*); env: ", setting_help(name, field)).group(1)
    assert page == help_default.replace("%%", "%")
    assert "{}" not in page and page != "empty"


def test_flags_whose_type_says_too_little_show_the_shape_they_take() -> None:
    from kafka_scorer.cli.help_style import setting_metavar

    fields = Settings.model_fields
    assert setting_metavar("topic_priorities", fields["topic_priorities"]) == "TOPIC=N,..."
    assert setting_metavar("priority_share", fields["priority_share"]) == "FRACTION"
    assert setting_metavar("chunking", fields["chunking"]) == "JSON"
    assert "TOPIC=N,..." in _table_rows(render())["topic_priorities"][3]
