"""What the demo's parts share: a served model, a sample job, the table layout and the progress line.

demo.py (CausalLM and classifier) and demo_rerank.py (a templated reranker) both build on these, so
neither imports the other's module for them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kafka_scorer.cli.submission import Submission
    from kafka_scorer.engine.scorer import Scorer

_KIND_LABELS = {"causal": "causal LM", "classification": "classifier", "reranker": "reranker"}


@dataclass
class DemoModel:
    """One served model: its worker reads `topic`; `kind` is "causal", "classification" or "reranker"
    (a CausalLM served with the prompt template `template`)."""

    kind: str
    scorer: Scorer
    random: bool
    topic: str = ""
    label_ids: list[int] = field(default_factory=list)
    template: str = ""

    def __post_init__(self) -> None:
        self.topic = f"demo.requests.{self.kind}"

    @property
    def label(self) -> str:
        """What the results table calls this kind."""
        return _KIND_LABELS[self.kind]

    @property
    def id_prefix(self) -> str:
        return "lm" if self.kind == "causal" else "cls"


@dataclass
class DemoJob:
    """A sample job and the model it is for; `expect_error` marks the deliberately bad one."""

    model: DemoModel
    submission: Submission
    expect_error: bool = False


def results_table(
    title: str, columns: list[tuple[str, str]], wide: str, min_width: int, wraps: str = ""
) -> Any:
    """A table of (name, justify) columns: ids, kinds and numbers keep their width; the `wide` column
    (scores, rankings) takes the rest but never less than `min_width`, so a narrow terminal folds an
    error text, not the numbers. Only `wide` and `wraps` may wrap."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for name, justify in columns:
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]  # justify is one of rich's literals, from the column table
            overflow="fold",
            no_wrap=name not in (wide, wraps),
            min_width=min_width if name == wide else None,
        )
    return table


def print_fitted(console: Any, table: Any) -> None:
    """Print `table` within the console's width: when its narrowest layout is still too wide (an
    80-column terminal), drop the vertical borders and outer padding and let every column wrap, instead
    of rich cutting the right-hand columns off."""
    from rich import box

    # rich squeezes wrapping columns to fit but crops what no-wrap columns still need beyond the width
    if sum(table._calculate_column_widths(console, console.options)) > console.width:
        table.box, table.pad_edge, table.collapse_padding = box.SIMPLE_HEAD, False, True
        for column in table.columns:
            column.no_wrap, column.min_width = False, None
    console.print(table)


def say(message: str) -> None:
    """A progress line on stderr; stdout holds only the table and the summary."""
    print(f"kafka-scorer demo: {message}", file=sys.stderr, flush=True)
