"""The Grafana dashboard in compose/grafana/, checked offline (CI has neither Grafana nor Prometheus).

A dashboard query that names a metric the worker does not export draws an empty panel and nobody
notices; so every PromQL expression in it (panel targets and template variables) is read here and
each metric it names must be a series the worker's own registry exports — derived from
`WorkerMetrics`, not from a list kept by hand, with the series suffixes Prometheus adds (`_total` for
counters, `_bucket`/`_sum`/`_count` for histograms, `_info` for info metrics). Label names must be
the worker's or the ones Prometheus attaches at scrape time. And the other way round: every metric
the worker exports has a panel. The provisioning files must point Grafana at the compose stack's
Prometheus and at the folder the dashboard is mounted in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from kafka_scorer.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "compose"
GRAFANA = COMPOSE_DIR / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
}
_SCRAPE_LABELS = {"instance", "job"}  # what Prometheus adds to every series it scrapes
# PromQL's aggregation operators and functions, and Grafana's label_values(metric, label)
_FUNCTIONS = frozenset(
    re.findall(
        r"\w+",
        """
        sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
        abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
        day_of_year days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction
        histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase
        irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round scalar
        sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year avg_over_time
        min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time
        stdvar_over_time last_over_time present_over_time label_values
        """,
    )
)
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?")


def exported() -> dict[str, set[str]]:
    """Every series name the worker's registry exports, with its labels."""
    series: dict[str, set[str]] = {}
    for metric in vars(WorkerMetrics()).values():
        if isinstance(metric, MetricWrapperBase):
            for suffix in _SUFFIXES[metric._type]:
                labels = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
                series[metric._name + suffix] = labels
    return series


def families() -> dict[str, list[str]]:
    """Each exported metric (as its registry names it) and its series, from the public collect() API."""
    out = {}
    for family in WorkerMetrics().registry.collect():
        out[family.name] = [family.name + suffix for suffix in _SUFFIXES[family.type]]
    return out


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses. Strings, ranges and Grafana variables are
    dropped first; label names come from matchers, grouping clauses and label_values' second argument;
    an identifier is a function when a parenthesis follows, a keyword when PromQL reserves it, else a
    metric. Unknown functions count as metrics, so a typo cannot pass unseen."""
    labels: set[str] = set()
    if m := re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", expr):
        labels.add(m.group(2))
        expr = m.group(1) or ""
    text = _VARIABLE.sub("", _RANGE.sub("", expr))
    for matchers in _MATCHERS.findall(_STRING.sub('""', text)):
        labels.update(_MATCHER_LABEL.findall(matchers))
    text = _MATCHERS.sub(" ", _STRING.sub('""', text))
    for _, grouped in _GROUPING.findall(text):
        labels.update(name.strip() for name in grouped.split(",") if name.strip())
    text = _GROUPING.sub(" ", text)
    metrics = set()
    for name, call in _IDENTIFIER.findall(re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", text)):
        if call and name in _FUNCTIONS:
            continue
        if not call and name in _KEYWORDS:
            continue
        metrics.add(name)
    return metrics, labels


def _panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels folded into a row


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query template variable."""
    found = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" in target:
                found.append((f"panel {panel['title']!r}", target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            found.append(
                (f"variable ${variable['name']}", query["query"] if isinstance(query, dict) else query)
            )
    return found


def _scrape_labels() -> set[str]:
    """Prometheus' own target labels plus the static ones prometheus.yml sets on the worker targets."""
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    static = {
        label
        for job in config["scrape_configs"]
        for group in job.get("static_configs", [])
        for label in group.get("labels", {})
    }
    return _SCRAPE_LABELS | static


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text(encoding="utf-8"))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# ---- the checker itself has to catch what it claims to catch ---------------------------------------


def test_names_in_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, code) (rate(kafka_scorer_x_bucket{instance=~"$instance", '
        'a!="b,c"}[$__rate_interval]))) / on (instance) group_left kafka_scorer_y offset 5m > 1e3'
    )
    assert names_in(expr) == ({"kafka_scorer_x_bucket", "kafka_scorer_y"}, {"le", "code", "instance", "a"})
    assert names_in("up == 0 and nosuchfunction(kafka_scorer_jobs_total)")[0] == {
        "up",
        "nosuchfunction",
        "kafka_scorer_jobs_total",
    }
    assert names_in("label_values(kafka_scorer_info, instance)") == ({"kafka_scorer_info"}, {"instance"})
    assert names_in("label_values(instance)") == (set(), {"instance"})


def test_the_exported_series_follow_the_registry() -> None:
    series = exported()
    assert {"kafka_scorer_jobs_total", "kafka_scorer_info", "kafka_scorer_consumer_lag"} <= set(series)
    assert {
        "kafka_scorer_batch_tokens_bucket",
        "kafka_scorer_batch_tokens_sum",
        "kafka_scorer_batch_tokens_count",
    } <= set(series)
    assert (
        series["kafka_scorer_errors_total"] == {"code"} and "le" in series["kafka_scorer_batch_jobs_bucket"]
    )
    # the private attributes read above agree with what the registry itself reports
    assert {name for names in families().values() for name in names} == set(series)
    text = WorkerMetrics().render().decode()
    for name in series:  # labelled series appear once a label value has been seen: unlabelled ones at once
        if not name.endswith("_info") and not series[name] - {"le"}:
            assert re.search(rf"^{name}(\{{| )", text, re.MULTILINE), f"{name} not in /metrics"


# ---- the dashboard ---------------------------------------------------------------------------------


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS, "no dashboard JSON in compose/grafana/dashboards"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_names_only_what_the_worker_exports(path: Path) -> None:
    series = exported()
    known_labels = set().union(*series.values()) | _scrape_labels()
    found = queries(_load(path))
    assert len(found) >= 10
    for where, expr in found:
        metrics, labels = names_in(expr)
        assert metrics or expr.startswith("label_values("), f"{where}: no metric in {expr!r}"
        unknown = metrics - set(series)
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the worker ({expr!r})"
        assert labels <= known_labels, (
            f"{where}: labels {sorted(labels - known_labels)} exist nowhere ({expr!r})"
        )


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_exported_metric_has_a_panel(path: Path) -> None:
    used = set().union(*(names_in(expr)[0] for _, expr in queries(_load(path))))
    missing = [name for name, names in families().items() if not used & set(names)]
    assert not missing, f"metrics the worker exports but {path.name} does not chart: {missing}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_use_the_provisioned_datasource_and_do_not_overlap(path: Path) -> None:
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    dashboard = _load(path)
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        for target in [panel, *panel.get("targets", [])]:
            if "datasource" in target:
                assert target["datasource"] == {"type": source["type"], "uid": source["uid"]}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{panel['title']} is wider than the grid"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == source["uid"]


def test_grafana_is_provisioned_from_the_repository(compose: dict[str, Any]) -> None:
    """The datasource reaches the compose Prometheus; the provider reads the folder the dashboards are
    mounted at; the home dashboard is one of them."""
    grafana = compose["services"]["grafana"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    mounts = dict(reversed(volume.removesuffix(":ro").split(":")) for volume in grafana["volumes"])
    assert (COMPOSE_DIR / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    url = urlsplit(source["url"])
    assert url.hostname in compose["services"], f"datasource url {source['url']} is not a compose service"
    ports = [str(p).rsplit(":", 1)[-1] for p in compose["services"][url.hostname]["ports"]]
    assert str(url.port) in ports, f"{url.hostname} does not listen on {url.port}"
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/kafka-scorer.yml").read_text())[
        "providers"
    ]
    folder = provider["options"]["path"]
    assert (COMPOSE_DIR / mounts[folder]).resolve() == GRAFANA / "dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (
        home.startswith(folder + "/") and (GRAFANA / "dashboards" / home.removeprefix(folder + "/")).is_file()
    )
