"""The one list of rules ``mxc check`` runs, in order, with their names and severities.

A rule is a small function ``Subject -> Iterable[Issue]`` whose docstring says what it
checks and why; its name is what findings, ``--format junit`` test cases and docs/check.md
use. Adding a rule: write the function in the rules module of its topic, add it here, add
a failing and a passing case to tests/test_check_rules.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mxc.compiler.check import rules_container, rules_env, rules_maxtext, rules_notify, rules_resources, rules_xla
from mxc.compiler.check.findings import Severity
from mxc.compiler.check.subject import Issue, Subject


@dataclass(frozen=True)
class Rule:
    name: str
    severity: Severity
    check: Callable[[Subject], Iterable[Issue]]
    # What the rule reads: spec sections ("env") or keys in them ("image.ref"). A matrix combination
    # that changes none of these sections reuses the base spec's result (tests/test_check_matrix.py
    # proves it equals a full run); in a spec with errors, the rule runs unless it reads a value in
    # error (partial.py).
    reads: frozenset[str] = frozenset()

    @property
    def sections(self) -> frozenset[str]:
        return frozenset(read.split(".", 1)[0] for read in self.reads)

    @property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(read.split(".")) for read in sorted(self.reads))

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        return " ".join(self.doc.split("\n\n")[0].split())


# The jaxlib a spec runs with: its pin, its maxtext's, else its image's known one (index.json).
_XLA = frozenset({"env", "code.jaxlib_version", "code.maxtext_version", "image.ref"})
_ENV = frozenset({"env", "resources"})
_MAXTEXT = frozenset({"model", "code"})
_SHAPE = frozenset({"model", "code", "env", "resources"})

RULES: tuple[Rule, ...] = (
    Rule("jaxlib-catalog", "error", rules_xla.jaxlib_catalog, _XLA),
    Rule("xla-flag-syntax", "error", rules_xla.xla_flag_syntax, _XLA),
    Rule("xla-flag-unknown", "error", rules_xla.xla_flag_unknown, _XLA),
    Rule("xla-flag-version", "error", rules_xla.xla_flag_version, _XLA),
    Rule("xla-flag-value", "error", rules_xla.xla_flag_value, _XLA),
    Rule("xla-flag-deprecated", "warning", rules_xla.xla_flag_deprecated, _XLA),
    Rule("xla-flag-conflict", "error", rules_xla.xla_flag_conflict, _XLA),
    Rule("env-var-vendor", "error", rules_env.env_var_vendor, _ENV),
    Rule("env-var-value", "error", rules_env.env_var_value, _ENV),
    Rule("env-var-unknown", "warning", rules_env.env_var_unknown, _ENV),
    Rule("env-var-deprecated", "note", rules_env.env_var_deprecated, _ENV),
    Rule("jax-platforms", "error", rules_env.jax_platforms, _ENV),
    Rule("env-dangerous", "note", rules_env.env_dangerous, _ENV),
    Rule("env-noted", "warning", rules_env.env_noted, _ENV),
    Rule("maxtext-catalog", "error", rules_maxtext.maxtext_catalog_rule, _MAXTEXT),
    Rule("maxtext-override-unknown", "error", rules_maxtext.maxtext_override_unknown, _MAXTEXT),
    Rule("maxtext-override-value", "error", rules_maxtext.maxtext_override_value, _MAXTEXT),
    Rule("maxtext-model-key", "error", rules_maxtext.maxtext_model_key, _MAXTEXT),
    Rule("batch-divisible", "error", rules_resources.batch_divisible, _SHAPE),
    Rule("mesh-devices", "error", rules_resources.mesh_devices, _SHAPE),
    Rule("fp8-hardware", "error", rules_resources.fp8_hardware, frozenset({"model", "code", "resources"})),
    Rule("checkpoint-time", "error", rules_resources.checkpoint_time, _SHAPE | {"checkpoint", "runtime"}),
    Rule("restart-checkpoint", "warning", rules_resources.restart_checkpoint, frozenset({"restart", "checkpoint"})),
    Rule("sbatch-extra", "warning", rules_resources.sbatch_extra_noted, frozenset({"resources"})),
    Rule("notify-destination", "error", rules_notify.notify_destination, frozenset({"notify"})),
    Rule("container-privileged", "warning", rules_container.container_privileged, frozenset({"runtime"})),
    Rule("container-dangerous", "note", rules_container.container_dangerous, frozenset({"runtime"})),
)

# Findings that do not come from a rule function, with what they mean (docs, junit).
OTHER_CHECKS: dict[str, str] = {
    "schema": "The spec is a valid mxc/v1 document (the same validation as mxc build).",
    "matrix": "A matrix combination could be applied to the spec.",
    "probe-xla": "--probe: jaxlib itself parsed the XLA flags (an unknown flag aborts it).",
    "probe-maxtext": "--probe: MaxText's own config validation (pyconfig) accepted the model overrides.",
    "cue": "A .cue spec unified with specs/schema.cue (cue vet) and exported to JSON.",
    "maxtext-config-file-key": "Every key of model.config_file is a key of the spec's MaxText catalog (a warning).",
}

BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
