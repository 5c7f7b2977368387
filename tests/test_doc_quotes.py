"""The lines the docs quote are lines the code prints (issue 21).

Every line of a ```text block in the quickstart, troubleshooting and operations pages must be what some
string of the package produces: each string literal of kafka_scorer/ (f-strings and %-formats with
their fields as wildcards) is a template, and a quoted line, with or without its log prefix
(`LEVEL logger: `, `kafka-scorer CMD: error: `), must match one of them whole. A template must fix at
least `_MIN_FIXED` characters of the line, so a bare `{prog}: {line}` proves nothing. Reworded code
with stale docs, or a doc line nobody prints, fails here.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/quickstart.md", "docs/troubleshooting.md", "docs/operations.md")
_MIN_FIXED = 15
_PERCENT_FIELD = re.compile(r"%(?:\.\d+)?[sdrfi]")
_LOG_PREFIX = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
_PROG_PREFIX = re.compile(r"^kafka-scorer \w+: (?:error: |warning: )?")
_QUERY = re.compile(r"\b(?:rate|histogram_quantile|sum)\(")  # PromQL examples are not output


def quoted_lines() -> list[tuple[str, str]]:
    """(doc, line) for every line of every ```text block that shows output."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```text\n(.*?)```", (ROOT / doc).read_text(), flags=re.S):
            lines = [line for line in block.splitlines() if line.strip()]
            if not any(_QUERY.search(line) for line in lines):
                out.extend((doc, line) for line in lines)
    return out


@cache
def templates() -> list[tuple[re.Pattern[str], int]]:
    """Every string literal of the package as (a regex with its fields as wildcards, fixed characters)."""
    out = []
    for path in sorted((ROOT / "kafka_scorer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            parts = _parts(node)
            if parts is None:
                continue
            fixed = sum(len(p) for p in parts if p is not None)
            if fixed >= _MIN_FIXED:
                regex = "".join(".*?" if p is None else re.escape(p) for p in parts)
                out.append((re.compile(regex, re.S), fixed))
    return out


def _parts(node: ast.AST) -> list[str | None] | None:
    """A literal's fixed text and fields (None), or None for a node that is no string literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        pieces: list[str | None] = [node.value]
    elif isinstance(node, ast.JoinedStr):
        pieces = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    else:
        return None
    out: list[str | None] = []
    for piece in pieces:
        if piece is None:
            out.append(None)
            continue
        for i, text in enumerate(_PERCENT_FIELD.split(piece)):
            if i:
                out.append(None)
            out.append(text)
    return out


def _printed(line: str) -> bool:
    bare = _LOG_PREFIX.sub("", line)
    candidates = {line, bare, _PROG_PREFIX.sub("", bare)}
    return any(pattern.fullmatch(text) for pattern, _ in templates() for text in candidates)


@pytest.mark.parametrize(("doc", "line"), quoted_lines())
def test_a_quoted_line_is_printed_by_the_code(doc: str, line: str) -> None:
    assert _printed(line), f"{doc} quotes a line no string of kafka_scorer/ prints:\n{line}"


def test_a_reworded_line_would_be_caught() -> None:
    line = (
        "WARNING kafka_scorer.kafka.outage: Kafka broker k:9092 still unreachable after 60s "
        "(5 Kafka client lines held back)"
    )
    assert _printed(line)
    assert not _printed(line.replace("still unreachable", "still down"))
