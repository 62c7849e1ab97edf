"""``mxc check`` results as text, GitHub annotations, JUnit XML or JSON.

A report has one target per checked spec (a matrix is one target with its combinations);
findings are kept per target for JUnit (one test suite per target, one test case per rule)
and merged across targets for text and annotations (a base spec's problem is printed once).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from mxc.compiler.check.findings import Finding, merge
from mxc.compiler.check.registry import OTHER_CHECKS, RULES
from mxc.compiler.errors import printable


@dataclass
class Target:
    file: str
    matrix: str | None = None
    combinations: int = 0
    skipped: str = ""  # why it was not checked (e.g. no CUE on this machine)
    findings: list[Finding] = field(default_factory=list)
    extra_checks: tuple[str, ...] = ("schema",)  # non-rule checks that ran for it
    not_run: dict[str, str] = field(default_factory=dict)  # rule -> why it could not run (a spec with errors)

    def not_run_lines(self) -> list[str]:
        """One line per reason: which rules did not run on this spec, so no silence reads as a pass."""
        by_why: dict[str, list[str]] = {}
        for rule, why in self.not_run.items():
            by_why.setdefault(why, []).append(rule)
        return [f"{self.name}: not checked: {', '.join(rules)} ({why})" for why, rules in by_why.items()]

    @property
    def name(self) -> str:
        return f"{self.file} x {self.matrix}" if self.matrix else self.file


@dataclass
class Report:
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe: dict[str, Any] | None = None

    @property
    def findings(self) -> list[Finding]:
        return merge(f for t in self.targets for f in t.findings)

    @property
    def failed(self) -> bool:
        return any(f.fails for f in self.findings)

    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0, "note": 0}
        for f in self.findings:
            out[f.severity] += 1
        return out

    def summary(self) -> str:
        checked = [t for t in self.targets if not t.skipped]
        combos = sum(t.combinations for t in checked)
        c = self.counts()
        parts = [f"{len(checked)} spec{'s' if len(checked) != 1 else ''}"]
        if combos:
            parts.append(f"{combos} combinations")
        skipped = len(self.targets) - len(checked)
        if skipped:
            parts.append(f"{skipped} skipped")
        probe = " (probed by jaxlib and MaxText)" if self.probe else ""
        verdict = "FAILED" if self.failed else "ok"
        return (f"mxc check: {verdict}: {', '.join(parts)}{probe}: {c['error']} error(s), {c['warning']} warning(s), "
                f"{c['note']} note(s)")


def text(report: Report) -> str:
    lines = [str(f) for f in report.findings]
    lines += [printable(f"note: {n}") for n in report.notes]
    lines += [printable(line) for t in report.targets for line in t.not_run_lines()]
    lines += [printable(f"{t.file}: skipped: {t.skipped}") for t in report.targets if t.skipped]
    if report.probe:
        lines.append(probe_line(report.probe))
    lines.append(report.summary())
    return "\n".join(lines) + "\n"


def probe_line(probe: dict[str, Any]) -> str:
    return (f"probe: {probe.get('tokens', 0)} distinct XLA flags through jaxlib {probe.get('jaxlib', '?')}, "
            f"{probe.get('maxtext_sets', 0)} distinct MaxText override sets through maxtext "
            f"{probe.get('maxtext_version') or '?'} pyconfig, in {probe.get('wall_seconds', 0):.1f} s")


def _escape_data(s: str) -> str:
    """A workflow command's message: GitHub's own escapes, then any other control character as text
    (a key holding an ANSI escape or a line separator must not reach the log raw)."""
    return printable(s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


_GITHUB_LEVEL = {"error": "error", "warning": "warning", "note": "notice"}


def github(report: Report) -> str:
    """GitHub Actions workflow commands: one annotation per finding, on the file and line."""
    out = []
    for f in report.findings:
        props = [f"file={_escape_property(f.file)}"]
        if f.line:
            props.append(f"line={f.line}")
        props.append(f"title={_escape_property(f'mxc check: {f.rule}')}")
        key = f"{f.key}: " if f.key else ""
        hint = f" ({f.suggestion})" if f.suggestion else ""
        combos = f" [{len(f.combinations)} combination(s): {', '.join(map(str, f.combinations[:10]))}]" if f.combinations else ""
        out.append(f"::{_GITHUB_LEVEL[f.severity]} {','.join(props)}::{_escape_data(key + f.message + hint + combos)}")
    for t in report.targets:
        if t.skipped:
            out.append(f"::notice file={_escape_property(t.file)},title=mxc check: skipped::{_escape_data(t.skipped)}")
        for line in t.not_run_lines():
            out.append(f"::notice file={_escape_property(t.file)},title=mxc check: not checked::{_escape_data(line)}")
    return "\n".join(out) + ("\n" if out else "")


def junit(report: Report) -> str:
    """JUnit XML: a test suite per checked spec, a test case per rule (errors and warnings fail).
    User text is ``printable``: XML 1.0 cannot even carry most control characters."""
    rule_names = [r.name for r in RULES]
    suites = ET.Element("testsuites", name="mxc check")
    total = failures = skipped_total = 0
    for t in report.targets:
        names = [*t.extra_checks, *rule_names]
        suite = ET.SubElement(suites, "testsuite", name=printable(t.name))
        by_rule: dict[str, list[Finding]] = {}
        for f in merge(t.findings):
            by_rule.setdefault(f.rule, []).append(f)
        for extra in by_rule:
            if extra not in names:
                names.append(extra)
        n_fail = n_skip = 0
        for name in names:
            case = ET.SubElement(suite, "testcase", classname=printable(t.file), name=name, time="0")
            found = by_rule.get(name, [])
            failing = [f for f in found if f.fails]
            if t.skipped or (name in t.not_run and not failing):
                ET.SubElement(case, "skipped", message=printable(t.skipped or t.not_run[name]))
                n_skip += 1
            elif failing:
                n_fail += 1
                el = ET.SubElement(case, "failure", message=printable(failing[0].message),
                                   type="error" if any(f.severity == "error" for f in failing) else "warning")
                el.text = "\n".join(str(f) for f in failing)
            notes = [f for f in found if not f.fails]
            if notes:
                ET.SubElement(case, "system-out").text = "\n".join(str(f) for f in notes)
        suite.set("tests", str(len(names)))
        suite.set("failures", str(n_fail))
        suite.set("errors", "0")
        suite.set("skipped", str(n_skip))
        if t.combinations:
            props = ET.SubElement(suite, "properties")
            ET.SubElement(props, "property", name="combinations", value=str(t.combinations))
        total += len(names)
        failures += n_fail
        skipped_total += n_skip
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    suites.set("errors", "0")
    suites.set("skipped", str(skipped_total))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def as_json(report: Report) -> dict[str, Any]:
    return {
        "ok": not report.failed,
        "summary": {**report.counts(), "specs": len([t for t in report.targets if not t.skipped]),
                    "combinations": sum(t.combinations for t in report.targets)},
        "findings": [f.as_dict() for f in report.findings],
        "targets": [
            {"file": t.file, "matrix": t.matrix, "combinations": t.combinations, "skipped": t.skipped or None,
             "findings": [f.as_dict() for f in merge(t.findings)], "not_run": t.not_run}
            for t in report.targets
        ],
        "notes": report.notes,
        "probe": report.probe,
        "rules": [{"name": r.name, "severity": r.severity, "summary": r.summary} for r in RULES],
        "other_checks": OTHER_CHECKS,
    }


def render(report: Report, fmt: str) -> str:
    if fmt == "github":
        return github(report)
    if fmt == "junit":
        return junit(report)
    if fmt == "json":
        return json.dumps(as_json(report), indent=2, sort_keys=True) + "\n"
    return text(report)
