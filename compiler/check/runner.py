"""Check a resolved spec (or every combination of a matrix over it): schema, then every rule.

Pure: the caller reads files (``Reader``) and the lockfile. A spec that does not validate
yields ``schema`` findings and no rule runs on it (rules need a valid spec).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mxc.compiler.check.findings import Finding, merge
from mxc.compiler.check.matrix import Combination, Matrix, apply_changes, expand
from mxc.compiler.check.registry import RULES, Rule
from mxc.compiler.check.subject import Issue, Locate, Subject, choose_jaxlib, choose_maxtext
from mxc.compiler.errors import SpecErrors
from mxc.compiler.loader import Loaded, Path
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import JobSpec
from mxc.compiler.validate import validate
from pydantic import ValidationError


@dataclass(frozen=True)
class Lock:
    """What the checker needs from a spec's lockfile (read by the caller)."""

    name: str = ""
    jaxlib: str | None = None


@dataclass
class Checked:
    """One checked spec or combination: its findings and, when it validated, what the rules saw."""

    file: str
    combination: Combination | None
    subject: Subject | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def spec(self) -> JobSpec | None:
        return self.subject.spec if self.subject is not None else None


def _locator(doc: Loaded, overlay: dict[Path, tuple[str, int]] | None) -> Locate:
    def locate(path: Path) -> tuple[str, int | None]:
        if overlay:
            for end in range(len(path), -1, -1):
                hit = overlay.get(path[:end])
                if hit is not None:
                    return hit[0], hit[1]
        return line_of(doc, path)

    return locate


def run_rules(subject: Subject, rules: Iterable[Rule] = RULES) -> list[Finding]:
    out: list[Finding] = []
    combos = (subject.combination,) if subject.combination is not None else ()
    for rule in rules:
        for issue in rule.check(subject):
            out.append(_finding(subject, rule.name, issue.severity or rule.severity, issue, combos))
    return out


def _finding(subject: Subject, rule: str, severity: str, issue: Issue, combos: tuple[int, ...]) -> Finding:
    file, line = subject.locate(issue.path)
    return Finding(file or subject.file, line, ".".join(map(str, issue.path)), rule, severity,  # type: ignore[arg-type]
                   issue.message, issue.suggestion, combos)


def _schema_findings(exc: SpecErrors, combos: tuple[int, ...]) -> list[Finding]:
    return [Finding(e.file, e.line, e.key, "schema", "error", e.message, e.suggestion, combos) for e in exc.errors]


def check_document(doc: Loaded, file: str, lock: Lock = Lock()) -> Checked:
    """Validate and run every rule on one resolved spec document."""
    try:
        spec = validate(doc, file)
    except SpecErrors as exc:
        return Checked(file, None, None, _schema_findings(exc, ()))
    subject = Subject(file, spec, _locator(doc, None), choose_jaxlib(spec, lock.jaxlib, lock.name), choose_maxtext(spec))
    return Checked(file, None, subject, run_rules(subject))


def check_matrix(doc: Loaded, file: str, matrix: Matrix, lock: Lock = Lock()) -> list[Checked]:
    """Every combination of ``matrix`` applied to the resolved spec ``doc``, checked."""
    results = []
    for combo in expand(matrix):
        results.append(check_combination(doc, file, combo, lock))
    return results


def check_combination(doc: Loaded, file: str, combo: Combination, lock: Lock = Lock()) -> Checked:
    data = apply_changes(doc.data, combo.changes)
    combos = (combo.number,)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError:
        merged = Loaded(data, {**doc.lines, **combo.lines})
        try:
            validate(merged, file)
        except SpecErrors as exc:
            return Checked(file, combo, None, _schema_findings(exc, combos))
        raise  # pragma: no cover - validate() agrees with model_validate
    subject = Subject(file, spec, _locator(doc, combo.lines), choose_jaxlib(spec, lock.jaxlib, lock.name),
                      choose_maxtext(spec), combination=combo.number)
    return Checked(file, combo, subject, run_rules(subject))


def findings_of(results: Iterable[Checked]) -> list[Finding]:
    return merge(f for r in results for f in r.findings)
