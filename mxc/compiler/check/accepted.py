"""``check.accept``: warnings a spec's reviewers have accepted, each with its reason.

A harmless finding that a production configuration carries on purpose (AMD's own scripts set
``CUDA_DEVICE_MAX_CONNECTIONS`` on ROCm) would otherwise fail every check of that spec, and a
check that always fails is a check nobody reads. An accepted warning is still printed, as a note
with the reason, so the acceptance stays visible; an acceptance that matches no warning (the
problem was fixed, or it is an error, which cannot be accepted) is itself a warning, so stale
acceptances do not pile up.
"""

from __future__ import annotations

from dataclasses import replace

from mxc.compiler.check.findings import Finding
from mxc.compiler.check.subject import Subject

RULE = "check-accept"


def apply(subject: Subject, findings: list[Finding]) -> list[Finding]:
    """``findings`` with the spec's accepted warnings turned into notes, plus a warning for each
    acceptance that matched nothing."""
    accepted = subject.spec.check.accept if subject.spec.check is not None else []
    if not accepted:
        return findings
    used: set[int] = set()
    out: list[Finding] = []
    for finding in findings:
        hit = next((i for i, a in enumerate(accepted)
                    if finding.severity == "warning" and a.rule == finding.rule and a.key == finding.key), None)
        if hit is None:
            out.append(finding)
            continue
        used.add(hit)
        out.append(replace(finding, severity="note", message=f"accepted ({accepted[hit].why}): {finding.message}"))
    combos = (subject.combination,) if subject.combination is not None else ()
    for i, entry in enumerate(accepted):
        if i in used:
            continue
        file, line = subject.locate(("check", "accept", i))
        out.append(Finding(file or subject.file, line, f"check.accept.{i}", RULE, "warning",
                           f"accepts {entry.rule} on {entry.key}, but the check finds no such warning "
                           "(fixed, or an error, which cannot be accepted)", "remove the entry", combos))
    return out
