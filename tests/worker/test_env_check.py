"""Misspelt KAFKA_SCORER_* variables are named, with the closest setting; real ones never are."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.config import Settings
from kafka_scorer.env_check import unknown_variables

SETTINGS = list(Settings.model_fields)


def test_a_typo_gets_the_closest_setting() -> None:
    lines = unknown_variables({"KAFKA_SCORER_BOOTSTRAP_SERVER": "x:9092"}, SETTINGS)
    assert lines == [
        "environment variable KAFKA_SCORER_BOOTSTRAP_SERVER is not a setting and is ignored: "
        "did you mean KAFKA_SCORER_BOOTSTRAP_SERVERS?"
    ]


def test_nothing_close_points_at_the_reference() -> None:
    (line,) = unknown_variables({"KAFKA_SCORER_ZZZ": "1"}, SETTINGS)
    assert "docs/configuration.md" in line


@given(st.sets(st.sampled_from(SETTINGS)), st.dictionaries(st.text(max_size=12), st.text(max_size=4)))
def test_valid_settings_and_other_variables_pass(names: set[str], others: dict[str, str]) -> None:
    environ = {f"KAFKA_SCORER_{name.upper()}": "1" for name in names}
    environ.update({k: v for k, v in others.items() if not k.upper().startswith("KAFKA_SCORER_")})
    environ["KAFKA_SCORER_VENV"] = ".venv"
    assert unknown_variables(environ, SETTINGS) == []
