"""--probe, the pure half: what to ask the real parsers, and their answers as findings.

A matrix of 100 combinations usually holds a few dozen distinct XLA flag tokens and a few
distinct MaxText override sets; the probe asks about each distinct one once
(mxc/runtime/probe/__init__.py runs the questions). The answers are mapped back to every spec and
combination that used the token or override set, at the line that wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mxc.compiler.check.findings import Finding
from mxc.compiler.check.runner import Checked
from mxc.compiler.check.subject import FlagUse
from mxc.compiler.contract_build import maxtext_args
from mxc.compiler.schema import JobSpec


def _token(use: FlagUse) -> str:
    return use.text if use.raw else f"--{use.name}={use.value}"


def maxtext_case(spec: JobSpec) -> tuple[str, tuple[str, ...], int]:
    """(config file, argv after it, emulated device count) exactly as the bundle runs MaxText."""
    args = maxtext_args(spec)
    # With model.config_file the argv holds no config path (the node program puts the file first): the
    # probe judges the overrides on MaxText's base.yml, the file's own keys are not probed.
    argv = list(args if spec.model.config_file else args[1:])
    nodes = spec.resources.nodes
    if nodes > 1 and "num_slices" not in spec.model.overrides:
        argv.append(f"num_slices={nodes}")  # CPU devices carry no slice index: one slice per node
    per_node = spec.resources.gpus_per_node or 1
    return spec.model.config, tuple(argv), nodes * per_node


@dataclass
class Plan:
    tokens: list[str] = field(default_factory=list)
    cases: dict[tuple[str, tuple[str, ...], int], str] = field(default_factory=dict)  # case -> id
    uses: list[tuple[Checked, list[tuple[FlagUse, str]], str]] = field(default_factory=list)

    def request(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "maxtext": [{"id": cid, "config": c, "argv": list(a), "devices": d} for (c, a, d), cid in self.cases.items()],
        }


def plan(results: list[Checked]) -> Plan:
    """Distinct questions for every checked spec/combination that validated."""
    p = Plan()
    seen_tokens: set[str] = set()
    for checked in results:
        subject = checked.subject
        if subject is None:
            continue
        spec = subject.spec
        uses = [(u, _token(u)) for u in subject.flag_uses if not u.problem and u.name]
        for _, tok in uses:
            if tok not in seen_tokens:
                seen_tokens.add(tok)
                p.tokens.append(tok)
        case = maxtext_case(spec)
        cid = p.cases.setdefault(case, f"m{len(p.cases) + 1}")
        p.uses.append((checked, uses, cid))
    return p


_NOT_A_KEY = re.compile(r"'([a-z0-9_]+)' not in '")
_OVERRIDDEN = re.compile(r"Keys \[([^\]]*)\] are overridden by both model config")
_PYDANTIC_LOC = re.compile(r"^([a-z][a-z0-9_]*)\n  (.*?)(?: \[type=|$)", re.M)


def maxtext_message(error: str) -> tuple[list[str], str]:
    """MaxText's error -> (override keys it names, one readable line)."""
    m = _NOT_A_KEY.search(error)
    if m:
        return [m.group(1)], f"MaxText: '{m.group(1)}' is not a config key"
    m = _OVERRIDDEN.search(error)
    if m:
        keys = re.findall(r"'([a-z0-9_]+)'", m.group(1))
        return keys, "MaxText: " + error.split(": ", 1)[-1].split("This is not allowed")[0].strip() + " (not allowed)"
    locs = _PYDANTIC_LOC.findall(error)
    if locs:
        return [k for k, _ in locs], "MaxText: " + "; ".join(f"{k}: {msg.strip()}" for k, msg in locs)
    first = error.replace("Value error, ", "").strip().splitlines()
    text = " ".join(line.strip() for line in first if line.strip() and "errors.pydantic.dev" not in line)
    return re.findall(r"\b([a-z]+(?:_[a-z0-9]+)+)\b", text), "MaxText: " + text[:400]


def findings(p: Plan, answer: dict[str, Any]) -> list[Finding]:
    """The worker's answer -> findings at the lines that wrote each rejected flag or override."""
    out: list[Finding] = []
    bad: dict[str, str] = answer.get("bad_tokens", {})
    mt: dict[str, str | None] = answer.get("maxtext", {})
    jaxlib = answer.get("jaxlib", "?")
    for checked, uses, cid in p.uses:
        assert checked.subject is not None
        spec, locate = checked.subject.spec, checked.subject.locate
        combos = (checked.combination.number,) if checked.combination else ()
        for use, tok in uses:
            if tok in bad:
                file, line = locate(use.path)
                out.append(Finding(file or checked.file, line, ".".join(map(str, use.path)), "probe-xla", "error",
                                   f"jaxlib {jaxlib} rejects {tok}: {bad[tok].removeprefix('jaxlib: ')}", "", combos))
        error = mt.get(cid)
        if error:
            keys, text = maxtext_message(error)
            key = next((k for k in keys if k in spec.model.overrides), None)
            path = ("model", "overrides", key) if key else ("model",)
            file, line = locate(path)
            out.append(Finding(file or checked.file, line, ".".join(path), "probe-maxtext", "error",
                               f"{text} (maxtext {answer.get('maxtext_version') or '?'})", "", combos))
    return out

