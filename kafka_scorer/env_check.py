"""Catch misspelt `KAFKA_SCORER_*` environment variables.

pydantic-settings ignores environment variables that name no setting, so a typo such as
`KAFKA_SCORER_BOOTSTRAP_SERVER` passes in silence and the worker retries `localhost:9092` for ever.
Every command checks its environment before anything else and prints one warning per unknown name,
with the closest valid one: the worker through its log (text or JSON) right after the log set-up, the
others (`cli.main`) as plain lines; `submit` has its own check.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TextIO

PREFIX = "KAFKA_SCORER_"

# Variables with this prefix that are not settings but are read elsewhere on purpose.
_NOT_SETTINGS = frozenset({"KAFKA_SCORER_VENV"})
_NOT_SETTINGS_PREFIXES = ("KAFKA_SCORER_ASSUME_", "KAFKA_SCORER_TORCH_")  # ./dev's own switches


def unknown_variables(environ: Mapping[str, str], settings: Iterable[str]) -> list[str]:
    """One warning line per `KAFKA_SCORER_*` variable that names no setting, with a suggestion."""
    valid = {PREFIX + name.upper() for name in settings}
    lines = []
    for name in sorted(environ):
        if not name.upper().startswith(PREFIX) or name.upper() in valid:
            continue
        if name in _NOT_SETTINGS or name.startswith(_NOT_SETTINGS_PREFIXES):
            continue
        # Compared without the shared prefix, which would make every name look alike.
        suffixes = sorted(v.removeprefix(PREFIX) for v in valid)
        close = difflib.get_close_matches(name.upper().removeprefix(PREFIX), suffixes, n=1, cutoff=0.75)
        hint = f"did you mean {PREFIX}{close[0]}?" if close else "see docs/configuration.md for the settings"
        lines.append(f"environment variable {name} is not a setting and is ignored: {hint}")
    return lines


def warn_unknown(prog: str, environ: Mapping[str, str], stream: TextIO) -> None:
    """For commands without a log set-up of their own: the warnings first, as plain `PROG: warning:`
    lines, before the command prints anything else."""
    from kafka_scorer.config import Settings

    for line in unknown_variables(environ, Settings.model_fields):
        print(f"{prog}: warning: {line}", file=stream)
