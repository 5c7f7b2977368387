"""Link check over README.md, docs/*.md (and the notes under compose/), offline.

Relative links must name files that exist and `#anchors` headings that exist (GitHub's slug rules);
http(s) links are only checked for syntax, since CI has no network. Every docs page must be reachable
from README.md or docs/index.md, so no page is written and then forgotten. The example messages in
message-schema.md are decoded with the real codecs, so the page cannot show a message the worker
would reject.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import msgspec
import pytest

from kafka_scorer.wire.protocol import decode_job, decode_result

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
_HTML_HREF = re.compile(r"<a\s+(?:[^>]*\s)?href=\"([^\"]+)\"", re.IGNORECASE)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, so code samples are not mistaken for links or headings."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return lines


def slugify(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower-cased, punctuation dropped, spaces to `-`."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"(\*\*|__|\*|~~)", "", text)  # emphasis markers (single `_` stays: it is a word char)
    text = text.strip().lower()
    kept = "".join(
        ch
        for ch in text
        if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N") or unicodedata.category(ch) == "Mn"
    )
    return kept.replace(" ", "-")


def _is_setext_title(line: str) -> bool:
    """A paragraph line that an `===`/`---` underline turns into a heading (not a list, table or quote)."""
    stripped = line.strip()
    return bool(stripped) and not _ATX.match(line) and not stripped.startswith(("-", "*", "|", ">"))


def anchors(path: Path) -> set[str]:
    """Every anchor a page offers: heading slugs (duplicates numbered like GitHub) and HTML ids."""
    lines = _prose_lines(path.read_text(encoding="utf-8"))
    headings = []
    for i, line in enumerate(lines):
        if m := _ATX.match(line):
            headings.append(m.group(2))
        elif i > 0 and _is_setext_title(lines[i - 1]) and _SETEXT.match(line):
            headings.append(lines[i - 1].strip())
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in headings:
        slug = slugify(heading)
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    for line in lines:
        found.update(_HTML_ANCHOR.findall(line))
    return found


def links(path: Path) -> list[str]:
    """Link targets in prose: inline links and images, reference definitions, HTML hrefs."""
    found = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        if m := _REF_DEF.match(line):
            found.append(m.group(1))
            continue
        prose = _CODE_SPAN.sub("", line)
        found += _INLINE_LINK.findall(prose)
        found += _HTML_HREF.findall(prose)
    return found


def check_file(path: Path) -> list[str]:
    """Problems with the links of one Markdown file; empty when all resolve."""
    problems = []
    for target in links(path):
        parts = urlsplit(target)
        if parts.scheme in ("http", "https"):
            if not parts.netloc or "." not in parts.netloc or " " in target:
                problems.append(f"{target}: malformed URL")
            continue
        if parts.scheme == "mailto":
            continue
        if parts.scheme or parts.netloc:
            problems.append(f"{target}: unexpected scheme")
            continue
        dest = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not dest.exists():
            problems.append(
                f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} not found"
            )
            continue
        if parts.fragment:
            if dest.is_dir() or dest.suffix != ".md":
                problems.append(f"{target}: anchor on a file that is not Markdown")
            elif unquote(parts.fragment) not in anchors(dest):
                problems.append(f"{target}: no heading #{parts.fragment} in {dest.name}")
    return problems


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted((ROOT / "compose").glob("**/*.md"))]


# --- the checker itself: it has to catch what it claims to catch -------------------------------


def test_slugs_follow_github_rules() -> None:
    assert (
        slugify("Delivery modes: at-least-once vs exactly-once")
        == "delivery-modes-at-least-once-vs-exactly-once"
    )
    assert slugify("The `max_batch_tokens` setting") == "the-max_batch_tokens-setting"
    assert slugify("What's **new** in 1.2?") == "whats-new-in-12"
    assert slugify("A [link](x.md) heading") == "a-link-heading"
    assert slugify("Consumer -> producer") == "consumer---producer"


def test_checker_reports_broken_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## Same\n\n## Same\n\nText\n=====\n", encoding="utf-8"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "[ok](other.md) [ok](other.md#other-page) [ok](other.md#same-1) [ok](other.md#text) [ok](#title)\n"
        "[missing file](nope.md) [missing anchor](other.md#nothing) [self](#absent)\n"
        "[web](https://example.org/x) [bad web](https://) `[in code](gone.md)`\n"
        "[ref]: ghost.md\n"
        "```\n[in a fence](gone.md)\n```\n",
        encoding="utf-8",
    )
    problems = check_file(page)
    assert len(problems) == 5, problems
    for bad in ("nope.md", "other.md#nothing", "#absent", "https://", "ghost.md"):
        assert any(p.startswith(bad + ":") for p in problems), (bad, problems)


# --- the real pages ----------------------------------------------------------------------------


def test_docs_index_exists() -> None:
    assert (DOCS / "index.md").is_file()


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(ROOT)} does not exist"
    assert check_file(page) == []


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_docs_page_is_linked_from_readme_or_index(page: Path) -> None:
    if page.name == "index.md":
        assert README.is_file() and any(
            (README.parent / urlsplit(t).path).resolve() == page for t in links(README) if urlsplit(t).path
        ), "README.md must link to docs/index.md"
        return
    hubs = [p for p in (README, DOCS / "index.md") if p.is_file()]
    targets = {
        (hub.parent / urlsplit(t).path).resolve() for hub in hubs for t in links(hub) if urlsplit(t).path
    }
    assert page in targets, f"{page.name} is linked from neither README.md nor docs/index.md"


# --- the examples in message-schema.md are real messages -----------------------------------------

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(lang: str) -> list[str]:
    text = (DOCS / "message-schema.md").read_text(encoding="utf-8")
    return [body for kind, body in _BLOCK.findall(text) if kind == lang]


def test_json_examples_are_valid_jobs_and_results() -> None:
    """A reader copies these into a producer; a field the decoder rejects would be a broken promise."""
    jobs = results = 0
    for body in _blocks("json"):
        if body.lstrip().startswith('"'):  # a fragment of a result, shown on its own
            decoded = msgspec.json.decode("{" + body + "}")
            assert decoded["pooled_hidden_states"]["shape"], body
            continue
        if '"scores"' in body:
            result = decode_result(body.encode())
            assert (result.scores is None) == (result.error is not None), body
            results += 1
        else:
            decode_job(body.encode(), "application/json")
            jobs += 1
    assert jobs >= 2 and results >= 2


def test_msgpack_example_bytes_match_the_snippet() -> None:
    (snippet,) = [b for b in _blocks("python") if "msgspec.msgpack.encode" in b]
    job = ast.literal_eval(re.search(r"^job = (\{.*\})$", snippet, re.MULTILINE).group(1))
    job_hex, result_hex = [b for b in _blocks("text") if re.fullmatch(r"[0-9a-f \n]+", b)]
    job_bytes, result_bytes = bytes.fromhex(job_hex), bytes.fromhex(result_hex)
    assert msgspec.msgpack.encode(job) == job_bytes
    assert decode_job(job_bytes, "application/msgpack")[0].label_token_ids == job["label_token_ids"]
    text = (DOCS / "message-schema.md").read_text(encoding="utf-8")
    assert f"These are the {len(job_bytes)} bytes" in text and f"these {len(result_bytes)} bytes" in text
    shown = re.search(r"decode to `(\{.*?\})`", text).group(1)
    assert msgspec.msgpack.decode(result_bytes) == msgspec.json.decode(shown)
    assert decode_result(result_bytes).scores == msgspec.json.decode(shown)["scores"]


def test_operations_lists_exactly_the_metrics_the_worker_exports() -> None:
    """The metrics table is what people build dashboards from: no stale names, none missing."""
    from prometheus_client.metrics import MetricWrapperBase

    from kafka_scorer.worker.metrics import WorkerMetrics

    exported = {}
    for metric in vars(WorkerMetrics()).values():
        if isinstance(metric, MetricWrapperBase):
            name = metric._name + {"counter": "_total", "info": "_info"}.get(metric._type, "")
            exported[name] = (metric._type, set(metric._labelnames))
    assert len(exported) >= 10
    from kafka_scorer.worker.cache_metrics import ENGINE_SERIES  # read at each scrape

    for cache in ENGINE_SERIES:
        exported.update({name: (kind, set()) for name, kind in cache.exported.items()})
    table = (DOCS / "operations.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(kafka_scorer_\w+)(?:\{([\w,]+)\})?` \| (\w+) \|", table, re.MULTILINE)
    documented = {name: (kind, set(labels.split(",")) if labels else set()) for name, labels, kind in rows}
    assert set(documented) == set(exported)
    for name, (kind, labels) in documented.items():
        assert kind == exported[name][0], name
        assert labels == exported[name][1], f"{name}: its labels are {exported[name][1]}"
