"""What ``mxc build`` refuses that ``mxc check`` would also find: MaxText overrides MaxText refuses.

A typo in ``model.overrides`` (``stepz: 30``, ``steps: thirty``) used to pass build and run and
fail on Slurm after the queue wait. The build runs the checker's MaxText rules (same catalogs,
same messages, no MaxText import) and fails with exit 2 and a did-you-mean. Only these rules:
loading the whole checker would cost the build its 0.3 s budget (docs/performance.md).
"""

from __future__ import annotations

from mxc.compiler.check import rules_maxtext
from mxc.compiler.check.subject import Pin, Subject, choose_maxtext
from mxc.compiler.errors import SpecError
from mxc.compiler.loader import Loaded
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import JobSpec

# (registry name, rule): the registry holds them as errors; tests/test_build_gate.py pins that.
BUILD_RULES = (
    ("maxtext-catalog", rules_maxtext.maxtext_catalog_rule),
    ("maxtext-override-unknown", rules_maxtext.maxtext_override_unknown),
    ("maxtext-override-value", rules_maxtext.maxtext_override_value),
    ("maxtext-model-key", rules_maxtext.maxtext_model_key),
)


def build_errors(doc: Loaded, file: str, spec: JobSpec) -> list[SpecError]:
    """Every problem the MaxText rules find in a validated spec, as file:line spec errors."""
    if not spec.model.overrides and spec.code.maxtext_catalog is None:
        return []
    subject = Subject(file, spec, lambda path: line_of(doc, path), Pin(None, None, "not used by these rules"),
                      choose_maxtext(spec))
    errors = []
    for _, rule in BUILD_RULES:
        for issue in rule(subject):
            where, line = subject.locate(issue.path)
            errors.append(SpecError(where or file, line, ".".join(map(str, issue.path)), issue.message,
                                    issue.suggestion))
    return errors
