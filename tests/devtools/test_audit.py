"""`./dev audit` reads pip-audit's JSON report: a vulnerability with a fixed release fails the landing
(we can refresh the lock), one without a fix is reported only, and an audit that could look nothing up
says so loudly instead of passing as clean."""

from __future__ import annotations

from devtools.audit import UNAUDITED, verdict


def _dep(name: str, *vulns: dict) -> dict:
    return {"name": name, "version": "1.0", "vulns": list(vulns)}


def test_a_vulnerability_with_a_fix_fails_and_names_package_advisory_and_fix() -> None:
    report = {
        "dependencies": [
            _dep("ok"),
            _dep("bad", {"id": "PYSEC-1", "aliases": ["CVE-9"], "fix_versions": ["1.1"]}),
        ]
    }
    result = verdict(report)
    assert result.failed
    assert "bad 1.0: PYSEC-1 / CVE-9 (fixed in 1.1)" in result.lines()
    assert result.audited == 2


def test_a_vulnerability_without_a_fix_is_reported_not_failed() -> None:
    result = verdict({"dependencies": [_dep("old", {"id": "GHSA-x", "fix_versions": []})]})
    assert not result.failed
    assert "old 1.0: GHSA-x (no fixed release yet)" in result.lines()


def test_nothing_looked_up_is_said_loudly() -> None:
    skipped = {"name": "torch", "skip_reason": "Dependency not found on PyPI and could not be audited"}
    result = verdict({"dependencies": [skipped, skipped]})
    assert not result.failed
    (line,) = result.lines()
    assert UNAUDITED in line and "2 locked packages" in line
