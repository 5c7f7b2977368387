"""A progress bar on stderr for commands that send jobs (`submit`, `demo`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class ProgressBar:
    """Done/total with live throughput on stderr; a no-op when disabled.

    Rich must not redirect stdout: results may be streaming there.
    """

    def __init__(self, total: int, description: str, *, enabled: bool = True) -> None:
        self.total = total
        self.description = description
        self.enabled = enabled and total > 0
        self._bar: tuple[Progress, TaskID] | None = None
        """Rich's live bar and its one task, once shown."""
        self._started = time.monotonic()
        self._items = 0
        self._done = 0

    def __enter__(self) -> ProgressBar:
        self._started = time.monotonic()
        return self

    def restart_clock(self) -> None:
        """Throughput counts from here (the first send), not from connecting to the cluster; the bar
        appears here too, so a run that never connects prints no `0/N` line before its error."""
        self._started = time.monotonic()
        if self.enabled and self._bar is None:
            self._show()
        if self._bar is not None:
            progress, task = self._bar
            progress.reset(task, total=self.total, completed=self._done, rate="")

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            redirect_stdout=False,
            redirect_stderr=False,
        )
        progress.start()
        self._bar = progress, progress.add_task(self.description, total=self.total, rate="")

    def advance(self, items: int = 0) -> None:
        self._done += 1
        self._items += items
        if self._bar is not None:
            progress, task = self._bar
            progress.update(task, advance=1, rate=self.rate_text())

    def rate_text(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return f"{self._done / elapsed:,.1f} jobs/s  {self._items / elapsed:,.1f} items/s"

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None
