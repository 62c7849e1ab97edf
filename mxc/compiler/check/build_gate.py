"""What ``mxc build`` refuses: every error ``mxc check`` finds without the network or ``--probe``.

An unknown XLA flag, ``NCCL_DEBUG: 3``, ``remat_policy: fulll`` or a mesh that does not cover the
devices used to build, and failed a minute into the run (on a cluster, after the queue wait).
The build runs every rule of the checker's registry (registry.py: a rule added there gates the
build too) on the validated spec, with the jaxlib ``mxc check`` would pick (the lockfile's), and
the spec's ``check.accept``: an error is a SpecError (exit 2, ``file:line: key: message``,
nothing written), a warning is returned for the build to print and does not stop it. No rule
reaches the network or imports jax or MaxText: they judge against the shipped catalogs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mxc.compiler.check import accepted
from mxc.compiler.check.findings import Finding
from mxc.compiler.check.runner import check_document, check_valid
from mxc.compiler.check.subject import NO_LOCK, Lock
from mxc.compiler.errors import SpecError
from mxc.compiler.loader import Loaded
from mxc.compiler.schema import JobSpec


@dataclass(frozen=True)
class Gate:
    errors: list[SpecError] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)


def build_gate(doc: Loaded, file: str, spec: JobSpec, lock: Lock = NO_LOCK) -> Gate:
    """The check's findings on a validated spec, split into what refuses the build and what it prints."""
    checked = check_valid(doc, file, spec, lock)
    assert checked.subject is not None
    findings = accepted.apply(checked.subject, checked.findings)
    return Gate(_errors(findings), [f for f in findings if f.severity == "warning"])


def invalid_spec_errors(doc: Loaded, file: str, lock: Lock = NO_LOCK) -> list[SpecError]:
    """A spec that does not validate: its schema errors, those hidden behind them and the errors of
    every rule that can judge the rest (partial.py), as ``mxc check`` lists them, in one refusal."""
    return _errors(check_document(doc, file, lock).findings)


def _errors(findings: list[Finding]) -> list[SpecError]:
    return [SpecError(f.file, f.line, f.key, f.message, f.suggestion) for f in findings if f.severity == "error"]
