"""pytest-timeout's `thread` method for every asyncio test (a plugin, registered in tests/conftest.py).

The default `signal` method raises its failure from a SIGALRM handler, in whatever Python frame the main
thread is running when the alarm comes. In an asyncio test that is often not the test's own coroutine but
a background task's step or a loop callback (a reply watcher decoding records, a commit sampler), and
asyncio catches the exception there: it becomes that task's result or a logged "Exception in callback",
the test runs on, and the one-shot alarm never fires again. The busier the loop (a machine overloaded by
parallel runs), the likelier: that is how a churn test once hung for over 10 minutes past a 300 s
timeout. The `thread` method watches from another thread, dumps every thread's stack and ends the process
(under xdist the worker is reported crashed on that test and replaced), which nothing can swallow.
"""

from __future__ import annotations

import inspect

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.function):
            item.add_marker(_with_thread_method(item.get_closest_marker("timeout")), append=False)


def _with_thread_method(marker: pytest.Mark | None) -> pytest.MarkDecorator:
    """The test's own timeout marker (if any) with the method set to `thread` unless it names one."""
    if marker is None:
        return pytest.mark.timeout(method="thread")
    kwargs = dict(marker.kwargs)
    if len(marker.args) < 2:
        kwargs.setdefault("method", "thread")
    return pytest.mark.timeout(*marker.args, **kwargs)
