"""`./dev image-check` without Docker: which engine and base it would use or why it skips, the loud skip
(a failure where CI requires the tier), the jobs it sends, how results are held to the engine's, and the
compose file as compose 1.x is given it."""

from __future__ import annotations

import fnmatch

import msgspec
import pytest
import yaml

from devtools import image_check
from devtools.compose_check import without_name_key
from devtools.docker_engine import EngineFacts, plan_engine
from devtools.image_base import OFFICIAL_BASE, plan_base, standin_tag
from devtools.image_check import REQUIRE_ENV, compare_results, lock_mismatches, rerank_jobs, skip
from kafka_scorer.wire.protocol import Job, Reranked, Result
from tests.test_compose import COMPOSE_FILE


def facts(**overrides: object) -> EngineFacts:
    base: dict[str, object] = {
        "docker": "/usr/bin/docker",
        "dockerd": "/usr/sbin/dockerd",
        "root": True,
        "answers": False,
    }
    return EngineFacts(**{**base, **overrides})  # type: ignore[arg-type]


def test_an_engine_that_answers_is_used_as_it_is() -> None:
    assert plan_engine(facts(answers=True, dockerd=None, root=False)).action == "use"


def test_an_installed_daemon_is_started_by_root() -> None:
    plan = plan_engine(facts())
    assert plan.action == "start" and "--bridge=none" in plan.reason


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"docker": None}, "no docker client"),
        ({"dockerd": None}, "no dockerd is installed"),
        ({"root": False}, "needs root"),
    ],
)
def test_where_no_engine_can_start_the_plan_says_why(overrides: dict[str, object], why: str) -> None:
    plan = plan_engine(facts(**overrides))
    assert plan.action == "skip" and why in plan.reason


def test_the_official_base_wins_and_the_stand_in_is_built_only_when_missing() -> None:
    tag = standin_tag(b"ca")
    assert plan_base(True, tag, False, False, False).image == OFFICIAL_BASE
    assert plan_base(False, tag, True, False, False).action == "use"
    assert plan_base(False, tag, False, True, True).action == "build"
    assert "debootstrap" in plan_base(False, tag, False, False, True).reason
    assert plan_base(False, tag, False, True, False).action == "skip"


def test_the_stand_in_is_never_tagged_as_the_official_image_and_follows_the_ca_bundle() -> None:
    assert standin_tag(b"a") != standin_tag(b"b")
    assert not standin_tag(b"a").startswith("python:")


def test_a_skip_is_one_loud_line_and_a_failure_where_ci_requires_the_tier(monkeypatch, capsys) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert skip("no engine") == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SKIPPED" in err and "no engine" in err
    monkeypatch.setenv(REQUIRE_ENV, "1")
    assert skip("no engine") == 1
    assert "FAILED" in capsys.readouterr().err


def test_main_skips_without_touching_docker_where_no_engine_can_start(monkeypatch, capsys) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.setattr(image_check, "engine_facts", lambda: facts(docker=None))
    assert image_check.main([]) == 0
    assert "SKIPPED" in capsys.readouterr().err


def test_the_jobs_are_valid_rerank_jobs_with_distinct_ids() -> None:
    jobs = [msgspec.convert(job, Job) for job in rerank_jobs(50)]
    assert len({job.id for job in jobs}) == 50
    assert all(job.documents and job.top_n == 3 for job in jobs)


def result(job: str, scores: list[float], *, revision: str = "r1", indices: tuple[int, ...] = (0,)) -> Result:
    ranked = [Reranked(index=i, relevance_score=scores[i]) for i in indices]
    return Result(id=job, scores=[[s] for s in scores], model_revision=revision, results=ranked)


def test_results_within_the_tolerance_pass_and_report_the_largest_difference() -> None:
    comparison = compare_results([result("a", [0.5, 0.25])], [result("a", [0.50001, 0.25])], 1e-4)
    assert comparison.problems == [] and comparison.max_difference == pytest.approx(1e-5)


def test_every_way_a_container_result_can_differ_is_named() -> None:
    expected = [result("a", [0.5]), result("b", [0.5]), result("c", [0.5]), result("d", [0.5, 0.1])]
    received = [
        result("a", [0.6]),
        result("b", [0.5], revision="other"),
        Result(id="c", scores=None, error=None),
        result("d", [0.5, 0.1], indices=(1,)),
        result("e", [0.5]),
    ]
    problems = "\n".join(compare_results(expected, received, 1e-4).problems)
    assert "a: scores differ" in problems
    assert "b: model_revision" in problems
    assert "c: 0 scores" in problems
    assert "d: top_n documents" in problems
    assert "e: a result for a job never sent" in problems
    assert "no result" not in problems
    assert "x: no result" in "\n".join(compare_results([result("x", [0.1])], [], 1e-4).problems)


def test_compose_1x_gets_the_file_less_only_its_name_key() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    stripped = yaml.safe_load(without_name_key(text))
    original = yaml.safe_load(text)
    assert "name" in original and "name" not in stripped
    assert stripped == {k: v for k, v in original.items() if k != "name"}


LOCK = """# comment
torch==2.13.0
    # via kafka-scorer
numpy==2.2.6 ; python_full_version < '3.11'
numpy==2.5.5 ; python_full_version >= '3.11'
pytest==9.0.0
Typing_Extensions==4.15.0
"""


def test_the_image_is_held_to_the_lock_pins_that_apply_to_its_python() -> None:
    installed = {"torch": "2.13.0+cpu", "numpy": "2.5.5", "typing-extensions": "4.15.0"}
    assert lock_mismatches(LOCK, installed, "3.11.2") == (3, [])
    checked, problems = lock_mismatches(LOCK, {**installed, "numpy": "2.2.6"}, "3.11.2")
    assert checked == 3 and problems == ["numpy 2.2.6 in the image, 2.5.5 in the lock"]
    assert lock_mismatches(LOCK, {"numpy": "2.2.6"}, "3.10.12") == (1, [])


@pytest.mark.parametrize("venv", [".venv", ".venv-floors", ".venv-latest"])
def test_the_build_context_leaves_out_every_venv_dev_makes(venv: str) -> None:
    patterns = [
        line.strip()
        for line in (COMPOSE_FILE.parents[1] / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert any(fnmatch.fnmatch(venv, pattern) for pattern in patterns)
    assert not any(fnmatch.fnmatch("constraints", pattern) for pattern in patterns)
