"""`./dev audit`: known vulnerabilities in the locked versions (constraints/lock.txt), by pip-audit.

pip-audit asks an advisory service about each pinned version and prints a JSON report; this reads it
and decides. A vulnerability with a fixed release fails the audit, naming the package, the advisory and
the fix, because the remedy is ours: refresh the lock (`./dev lock --upgrade-package NAME`). One with
no fix yet is printed and does not fail the landing, since nothing we can install removes it. Where the
service cannot be reached (these machines answer PyPI's per-version JSON with 404 and cannot reach
OSV), nothing was audited: one loud line says so and the audit passes, so CI does not go red over the
network while saying plainly that it checked nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

UNAUDITED = "AUDIT SKIPPED"


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    advisory: str
    fixed_in: tuple[str, ...]

    def line(self) -> str:
        fix = f"fixed in {', '.join(self.fixed_in)}" if self.fixed_in else "no fixed release yet"
        return f"{self.package} {self.version}: {self.advisory} ({fix})"


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    audited: int
    skipped: int

    @property
    def failed(self) -> bool:
        return any(finding.fixed_in for finding in self.findings)

    def lines(self) -> list[str]:
        if self.audited == 0:
            return [
                f"./dev audit: {UNAUDITED}: none of {self.skipped} locked packages could be looked up "
                "(the advisory service is unreachable from this machine); nothing was checked"
            ]
        out = [finding.line() for finding in self.findings]
        out.append(
            f"./dev audit: {self.audited} packages audited, {self.skipped} not found by the service, "
            f"{len(self.findings)} known vulnerabilities"
        )
        return out


def verdict(report: dict) -> Verdict:
    """pip-audit's JSON report (`-f json`) as findings and counts."""
    findings: list[Finding] = []
    audited = skipped = 0
    for dep in report.get("dependencies", []):
        if "skip_reason" in dep:
            skipped += 1
            continue
        audited += 1
        for vuln in dep.get("vulns", []):
            names = [vuln["id"], *vuln.get("aliases", [])]
            findings.append(
                Finding(
                    dep["name"],
                    dep.get("version", "?"),
                    " / ".join(names),
                    tuple(vuln.get("fix_versions", [])),
                )
            )
    return Verdict(tuple(findings), audited, skipped)


def main(argv: Sequence[str]) -> int:
    """argv: the pip-audit command, without its output format (this adds `-f json`)."""
    run = subprocess.run([*argv, "-f", "json"], capture_output=True, text=True)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        sys.stderr.write(run.stderr)
        print(f"./dev audit: pip-audit gave no report (exit {run.returncode})", file=sys.stderr)
        return 2
    result = verdict(report)
    for line in result.lines():
        print(line, file=sys.stderr)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
