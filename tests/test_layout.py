"""The package layout's import rules (docs/architecture.md, "Source map"), read from the source with `ast`.

- Only `kafka_scorer/kafka/` imports aiokafka: the worker, the client, the commands and the bench reach
  Kafka through that package, so the Kafka client library has one seam.
- The Kafka package stands under the worker and the client: it imports neither of them.
- The worker and the client are siblings: neither imports the other.
- The serving path (the worker, the client, the engine and the `worker`/`submit` commands) never imports
  the parts that exist to try the product without a cluster or a model: `embedded/` (the embedded
  brokers) and `checkpoints/` (models built on the spot, the packaged real checkpoint). Only the commands
  made for trying it (`broker`, `demo`, `model`) and the bench use them; they are listed here by name, so
  a new one is a decision, not an accident. (These two packages were once `testing/`, a name that made
  the commands look as if they served from test helpers.)
- The bench is a client of the product, not a part of it (issues 40, 47): it lives beside the package,
  outside the wheel (`kafka_scorer_bench/`), and nothing in the package imports it (`cli/main.py` names
  its command module as a string). Of the product's command line it uses only the two helpers its own
  command shares with every subcommand (the `--device`/`--dtype` flags, triton kept out on a CPU). The
  GPU check's orchestration is developer tooling (`devtools/`), which neither imports. The bench reaches
  the engine through `engine/api.py` only, but for the kernel micro-benchmarks listed here by name, which
  time engine parts by design.

Every import counts: at module level, inside a function (the lazy ones that keep `--help` light) and
under `if TYPE_CHECKING:`.

- The engine's stages come in their order (issue 47): prepare, pack, run, then start-up (`load/`); a
  stage imports no later stage, no kind's own folder (`late_interaction/`, `listwise/`, `vision/`) and
  nothing above the kinds (`kinds/`, the engine, the client); a kind's folder imports no other kind's.
  The model parts (`models/`, `layers/`, `attention/`, `kernels/`, `recurrent/`, `graphs/`) stand below
  and may serve any stage. And the prepare stage imports no torch, when imported alone: it runs on the
  prepare threads and answers input errors without the device's library (checked in a fresh process).
- Sizes (the layout's limits): no package file over 450 lines, `worker/service.py` (the wiring and the
  fetch loop) at most 320, no function in `worker/` over 60, at most 8 modules at the package's root.
- Nothing below the engine writes its attributes (issue 47): the start-up stage (warm-up, fallbacks,
  description, variants) takes narrow capabilities and returns what it chose, and only the in-process
  client (`engine/scorer.py`) and the engine (`engine/scoring_engine.py`) assign `scorer.<attr>` or
  `engine.<attr>`, read from the source the same way.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kafka_scorer"
BENCH = ROOT / "kafka_scorer_bench"

RUNTIME = ("kafka_scorer.worker", "kafka_scorer.client", "kafka_scorer.engine", "kafka_scorer.cli")
TRIAL_COMMANDS = {
    "kafka_scorer.cli.broker",
    "kafka_scorer.cli.demo",
    "kafka_scorer.cli.demo_rerank",
    "kafka_scorer.cli.model",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` imports, absolute names (relative imports resolved against `module`)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _imports() -> dict[str, set[str]]:
    return {
        module_name(path): imported(path.read_text(), module_name(path), path.name == "__init__.py")
        for path in sorted([*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")])
    }


IMPORTS = _imports()


def breaking(importer: str | tuple[str, ...], target: str, allowed: Collection[str] = ()) -> list[str]:
    """`module -> name` for each import of `target` by a module in `importer` (package prefixes)."""
    importers = (importer,) if isinstance(importer, str) else importer
    return sorted(
        f"{module} -> {name}"
        for module, names in IMPORTS.items()
        if any(_within(module, p) for p in importers) and module not in allowed
        for name in names
        if _within(name, target)
    )


def test_only_the_kafka_package_imports_aiokafka() -> None:
    outside = [
        f"{module} -> {name}"
        for module, names in sorted(IMPORTS.items())
        if not _within(module, "kafka_scorer.kafka")
        for name in sorted(names)
        if _within(name, "aiokafka")
    ]
    assert not outside, "route these through kafka_scorer/kafka/: " + "; ".join(outside)


@pytest.mark.parametrize("upper", ["kafka_scorer.worker", "kafka_scorer.client"])
def test_the_kafka_package_does_not_import_its_users(upper: str) -> None:
    assert not breaking("kafka_scorer.kafka", upper)


@pytest.mark.parametrize(
    ("importer", "target"),
    [("kafka_scorer.worker", "kafka_scorer.client"), ("kafka_scorer.client", "kafka_scorer.worker")],
)
def test_the_worker_and_the_client_do_not_import_each_other(importer: str, target: str) -> None:
    assert not breaking(importer, target)


@pytest.mark.parametrize("trial", ["kafka_scorer.embedded", "kafka_scorer.checkpoints"])
def test_the_serving_path_does_not_import_the_trial_parts(trial: str) -> None:
    assert not breaking(RUNTIME, trial, allowed=TRIAL_COMMANDS)


BENCH_COMMAND = {"kafka_scorer_bench.command"}


def test_the_package_does_not_import_the_bench() -> None:
    assert not breaking("kafka_scorer", "kafka_scorer_bench")


ENGINE_MICRO_BENCHES = {
    "kafka_scorer_bench.attention",
    "kafka_scorer_bench.fixed_matmul",
    "kafka_scorer_bench.label_kernel",
}


def test_the_bench_reaches_the_engine_through_its_api() -> None:
    inside = breaking("kafka_scorer_bench", "kafka_scorer.engine", allowed=ENGINE_MICRO_BENCHES)
    api = "kafka_scorer.engine.api"
    assert not [line for line in inside if not _within(line.partition(" -> ")[2], api)]


COMMAND_HELPERS = ("kafka_scorer.cli.help_style", "kafka_scorer.cli.no_triton")


def test_the_bench_uses_only_the_command_line_helpers() -> None:
    inside = breaking("kafka_scorer_bench", "kafka_scorer.cli")
    outside_helpers = [
        line
        for line in inside
        if line.partition(" -> ")[0] not in BENCH_COMMAND
        or not any(_within(line.partition(" -> ")[2], helper) for helper in COMMAND_HELPERS)
    ]
    assert not outside_helpers


@pytest.mark.parametrize("importer", ["kafka_scorer", "kafka_scorer_bench"])
def test_nothing_imports_the_developer_tools(importer: str) -> None:
    assert not breaking(importer, "devtools")


def test_there_is_no_testing_package_in_the_product() -> None:
    assert "kafka_scorer.testing" not in IMPORTS


def test_the_listed_trial_commands_exist() -> None:
    """A renamed command must be renamed here too, or the exception would quietly cover nothing."""
    assert set(IMPORTS) >= TRIAL_COMMANDS | BENCH_COMMAND | ENGINE_MICRO_BENCHES | set(COMMAND_HELPERS)


ENGINE_OWNERS = {"kafka_scorer.engine.scorer", "kafka_scorer.engine.scoring_engine"}
"""The client and the engine it holds: the only engine modules that write their attributes."""
ENGINE_NAMES = {"scorer", "engine"}


def _leaves(target: ast.expr) -> list[ast.expr]:
    """The names and attributes one assignment target binds (`a.x, (b.y, *c.z) = ...` binds three)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [leaf for element in target.elts for leaf in _leaves(element)]
    if isinstance(target, ast.Starred):
        return _leaves(target.value)
    return [target]


def written_engine_attributes(source: str) -> list[str]:
    """`scorer.<attr>` / `engine.<attr>` that `source` assigns, augments, deletes or `setattr`s."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            first = node.args[0] if node.args else None
            if (
                node.func.id in ("setattr", "delattr")
                and isinstance(first, ast.Name)
                and first.id in ENGINE_NAMES
            ):
                found.append(f"{node.func.id}({first.id}, ...)")
            continue
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for leaf in _leaves(target):
                if (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id in ENGINE_NAMES
                ):
                    found.append(f"{leaf.value.id}.{leaf.attr}")
    return found


def test_nothing_below_the_client_writes_the_engines_attributes() -> None:
    written = {
        module_name(path): found
        for path in sorted((PACKAGE / "engine").rglob("*.py"))
        if module_name(path) not in ENGINE_OWNERS and (found := written_engine_attributes(path.read_text()))
    }
    assert not written, "the start-up stage returns what it chose; the engine keeps it"
    assert set(IMPORTS) >= ENGINE_OWNERS, "a renamed owner must be renamed here too"


def test_the_write_reader_sees_every_kind_of_write() -> None:
    source = (
        "scorer.attention_backend = portable\n"
        "scorer.a, (engine.b, *scorer.c) = 1, (2, 3)\n"
        "engine.budget += 1\n"
        "setattr(scorer, 'auto_backend', True)\n"
        "del engine.graphs\n"
        "def f(scorer):\n    scorer.template: str = ''\n"
        "scorer.loaded.body = body\n"  # the loaded model's attribute, not the engine's
        "chosen.backend = portable\n"  # the stage's own record
    )
    assert sorted(written_engine_attributes(source)) == sorted(
        [
            "scorer.attention_backend",
            "scorer.a",
            "engine.b",
            "scorer.c",
            "engine.budget",
            "setattr(scorer, ...)",
            "engine.graphs",
            "scorer.template",
        ]
    )


def test_the_walk_sees_every_kind_of_import() -> None:
    """The rules above are only as good as this reader: lazy, relative and TYPE_CHECKING imports count."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from aiokafka import TopicPartition\n"
        "def later():\n    import aiokafka.admin\n"
        "from ..client import ScoringClient\n"
        "from . import ledger\n"
    )
    names = imported(source, "kafka_scorer.worker.intake")
    assert {"aiokafka", "aiokafka.admin", "kafka_scorer.client", "kafka_scorer.worker.ledger"} <= names
    assert "kafka_scorer.client.ScoringClient" in names


ENGINE = "kafka_scorer.engine"
STAGES = ("prepare", "pack", "run", "load")
"""The engine's stages in their order (docs/engine.md): a stage may import the ones before it."""
KIND_FOLDERS = ("late_interaction", "listwise", "vision")
ABOVE_THE_STAGES = ("kinds", "scoring_engine", "scorer", "engine_view", "api")


def _engine_imports(importer: str, targets: Collection[str]) -> list[str]:
    return [found for target in targets for found in breaking(f"{ENGINE}.{importer}", f"{ENGINE}.{target}")]


@pytest.mark.parametrize("stage", STAGES)
def test_an_engine_stage_imports_no_later_stage_and_no_kind(stage: str) -> None:
    later = [*STAGES[STAGES.index(stage) + 1 :], *KIND_FOLDERS, *ABOVE_THE_STAGES]
    assert not _engine_imports(stage, later)


@pytest.mark.parametrize("folder", KIND_FOLDERS)
def test_a_kinds_folder_imports_no_other_kind_and_nothing_above_the_stages(folder: str) -> None:
    others = [other for other in KIND_FOLDERS if other != folder]
    assert not _engine_imports(folder, [*others, *ABOVE_THE_STAGES])


def test_the_stage_rule_sees_a_backward_import() -> None:
    """The rule reads real edges: the kinds import the stages (the other way round is what it refuses)."""
    assert _engine_imports("kinds", ["prepare"]) and _engine_imports("run", ["pack"])


def test_the_prepare_stage_imports_no_torch() -> None:
    import subprocess
    import sys

    modules = sorted(
        module_name(path)
        for path in (PACKAGE / "engine" / "prepare").glob("*.py")
        if path.name != "__init__.py"
    )
    code = "import importlib, sys\n"
    code += "".join(f"importlib.import_module({name!r})\n" for name in modules)
    code += "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"the prepare stage pulled in {run.stdout.strip()}"


MAX_FILE_LINES, MAX_SERVICE_LINES, MAX_WORKER_FUNCTION_LINES, MAX_ROOT_MODULES = 450, 320, 60, 8


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_package_file_is_over_the_line_limit() -> None:
    sizes = {str(p.relative_to(ROOT)): _lines(p) for p in PACKAGE.rglob("*.py")}
    long = {path: lines for path, lines in sizes.items() if lines > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}; split a concept out"
    assert _lines(PACKAGE / "worker" / "service.py") <= MAX_SERVICE_LINES


def test_no_worker_function_is_over_the_line_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.name} {node.end_lineno - node.lineno + 1}"
        for path in (PACKAGE / "worker").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_WORKER_FUNCTION_LINES
    ]
    assert not long, f"worker functions over {MAX_WORKER_FUNCTION_LINES} lines: {long}"


def test_the_package_root_holds_few_modules() -> None:
    root = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= MAX_ROOT_MODULES, root
