"""Check a resolved spec (or every combination of a matrix over it): schema, then every rule.

Pure: the caller reads files (``Reader``) and the lockfile. A spec that does not validate
yields its ``schema`` findings, and the rules still run on what is left of it once the values
in error are set aside (partial.py); a rule that reads one of those says so in ``not_run``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from mxc.compiler.check.findings import Finding, merge
from mxc.compiler.check.matrix import Combination, Matrix, apply_changes, expand
from mxc.compiler.check.registry import RULES, Rule
from mxc.compiler.check.subject import NO_LOCK, Issue, Locate, Lock, Subject, choose_jaxlib, choose_maxtext
from mxc.compiler.errors import SpecError
from mxc.compiler.loader import Loaded, Path
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import Checkpoint, Env, JobSpec, Model, Restart
from mxc.compiler.validate import located_errors
from mxc.node.secretscan import secret_pair, secret_shape

__all__ = ["Checked", "Lock", "check_combination", "check_document", "check_matrix", "check_valid", "findings_of"]


@dataclass
class Checked:
    """One checked spec or combination: its findings and what the rules saw (the whole spec when it
    validated; what was left of it otherwise, with the rules that could not run and why)."""

    file: str
    combination: Combination | None
    subject: Subject | None
    findings: list[Finding] = field(default_factory=list)
    valid: bool = True
    not_run: dict[str, str] = field(default_factory=dict)  # rule -> why it did not run

    @property
    def spec(self) -> JobSpec | None:
        """The validated spec; None when it has errors (``subject`` then holds what was left of it)."""
        return self.subject.spec if self.subject is not None and self.valid else None


def _locator(doc: Loaded, overlay: dict[Path, tuple[str, int]] | None) -> Locate:
    def locate(path: Path) -> tuple[str, int | None]:
        if overlay:
            for end in range(len(path), -1, -1):
                hit = overlay.get(path[:end])
                if hit is not None:
                    return hit[0], hit[1]
        return line_of(doc, path)

    return locate


def run_rules(subject: Subject, rules: Iterable[Rule] = RULES,
              reuse: dict[str, list[Issue]] | None = None, changed: frozenset[str] = frozenset()) -> list[Finding]:
    """Every rule on ``subject``. With ``reuse`` (the base spec's issues per rule), a rule that
    reads none of the ``changed`` sections is not run again: its issues are the base's."""
    out: list[Finding] = []
    combos = (subject.combination,) if subject.combination is not None else ()
    for rule in rules:
        issues = reuse[rule.name] if reuse is not None and not (rule.sections & changed) else rule.check(subject)
        for issue in issues:
            out.append(_finding(subject, rule.name, issue.severity or rule.severity, issue, combos))
    return out


def _finding(subject: Subject, rule: str, severity: str, issue: Issue, combos: tuple[int, ...]) -> Finding:
    file, line = subject.locate(issue.path)
    return Finding(file or subject.file, line, ".".join(map(str, issue.path)), rule, severity,  # type: ignore[arg-type]
                   issue.message, issue.suggestion, combos)


def _schema_findings(errors: list[SpecError], combos: tuple[int, ...]) -> list[Finding]:
    return [Finding(e.file, e.line, e.key, "schema", "error", e.message, e.suggestion, combos) for e in errors]


def check_valid(doc: Loaded, file: str, spec: JobSpec, lock: Lock = NO_LOCK) -> Checked:
    """Every rule on a validated spec (what ``mxc build`` runs too)."""
    subject = _subject(file, spec, _locator(doc, None), lock)
    return Checked(file, None, subject, run_rules(subject))


def _subject(file: str, spec: JobSpec, locate: Locate, lock: Lock, combination: int | None = None) -> Subject:
    return Subject(file, spec, locate, choose_jaxlib(spec, lock.jaxlib, lock.name), choose_maxtext(spec),
                   combination=combination)


def check_document(doc: Loaded, file: str, lock: Lock = NO_LOCK) -> Checked:
    """Validate and run every rule on one resolved spec document."""
    try:
        spec = JobSpec.model_validate(doc.data)
    except ValidationError as exc:
        return _check_invalid(doc, file, exc, lock, None, {})
    return check_valid(doc, file, spec, lock)


def _check_invalid(doc: Loaded, file: str, exc: ValidationError, lock: Lock, combo: Combination | None,
                   overlay: dict[Path, tuple[str, int]]) -> Checked:
    """The schema errors, the problems hidden behind them, and every rule that reads none of the
    values in error, run on the rest of the spec (partial.py)."""
    from mxc.compiler.check.partial import judge_rest, touches

    combos = (combo.number,) if combo is not None else ()
    first = located_errors(doc, exc, file)
    rest = judge_rest(doc, file, first)
    findings = _schema_findings([e.error for e in first] + rest.errors, combos)
    if rest.spec is None:
        why = "the spec's errors above leave nothing the rules can judge"
        return Checked(file, combo, None, findings, valid=False, not_run={r.name: why for r in RULES})
    subject = _subject(file, rest.spec, _locator(doc, overlay), lock, combo.number if combo is not None else None)
    runnable, not_run = [], {}
    for rule in RULES:
        blocked = [p for p in rest.set_aside if any(touches(p, read) for read in rule.paths)]
        if blocked:
            shown = ", ".join(".".join(map(str, p)) for p in blocked)
            not_run[rule.name] = f"{shown} {'has an error' if len(blocked) == 1 else 'have errors'} above"
        else:
            runnable.append(rule)
    return Checked(file, combo, subject, findings + run_rules(subject, runnable), valid=False, not_run=not_run)


@dataclass
class _Base:
    """The matrix's base spec, validated once, with each rule's issues on it."""

    data: dict[str, Any]
    spec: JobSpec | None
    issues: dict[str, list[Issue]] | None


def check_matrix(doc: Loaded, file: str, matrix: Matrix, lock: Lock = NO_LOCK) -> list[Checked]:
    """Every combination of ``matrix`` applied to the resolved spec ``doc``, checked."""
    base = _base(doc, file, lock)
    return [check_combination(doc, file, combo, lock, base) for combo in expand(matrix)]


def _base(doc: Loaded, file: str, lock: Lock) -> _Base:
    try:
        spec = JobSpec.model_validate(doc.data)
    except ValidationError:
        return _Base(doc.data, None, None)
    subject = _subject(file, spec, _locator(doc, None), lock)
    return _Base(doc.data, spec, {rule.name: list(rule.check(subject)) for rule in RULES})


# Sections a combination may change without re-validating the whole spec: JobSpec's own
# validators are _consistent (image, code, runtime, resources) and _no_secrets (every string;
# the changed values are scanned below). tests/test_check_matrix.py pins that list and proves
# the fast path gives the same spec as a full validation.
_FAST_SECTIONS: dict[str, type[BaseModel]] = {"env": Env, "model": Model, "checkpoint": Checkpoint, "restart": Restart}


@lru_cache(maxsize=65536)
def _secret(text: str) -> bool:
    return secret_shape(text) is not None


@lru_cache(maxsize=65536)
def _secret_value(key: str, value: str) -> bool:
    return secret_pair(key, value) is not None


def _fast_validate(base: _Base, data: dict[str, Any], combo: Combination, sections: frozenset[str]) -> JobSpec | None:
    """The combination's spec from the validated base and its re-validated sections; None when
    only a full validation can tell (it then also produces the error messages)."""
    if base.spec is None or not sections <= _FAST_SECTIONS.keys() or not all(s in data for s in sections):
        return None
    for path, value in combo.changes:
        if _secret(str(path[-1])) or (isinstance(value, str) and _secret_value(str(path[-1]), value)):
            return None
    try:
        updates = {s: _FAST_SECTIONS[s].model_validate(data[s]) for s in sections}
    except ValidationError:
        return None
    return base.spec.model_copy(update=updates)


def check_combination(doc: Loaded, file: str, combo: Combination, lock: Lock = NO_LOCK, base: _Base | None = None) -> Checked:
    data = apply_changes(doc.data, combo.changes)
    sections = frozenset(str(path[0]) for path, _ in combo.changes)
    spec = _fast_validate(base, data, combo, sections) if base is not None else None
    if spec is None:
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            return _check_invalid(Loaded(data, {**doc.lines, **combo.lines}), file, exc, lock, combo, combo.lines)
    subject = _subject(file, spec, _locator(doc, combo.lines), lock, combo.number)
    reuse = base.issues if base is not None else None
    return Checked(file, combo, subject, run_rules(subject, reuse=reuse, changed=sections))


def findings_of(results: Iterable[Checked]) -> list[Finding]:
    return merge(f for r in results for f in r.findings)
