"""The training's environment: the spec's variables joined with the image's, composed where
training runs.

A container runtime decides on its own how a variable given on its command line meets the one the
image defines (Podman's and Docker's ``--env`` replace it; under Apptainer the image's wins), so
neither is asked: the node program writes the variables, each with its merge mode (run.json's
``env_merge``), to a JSON file in the run directory, and starts this file as the container's first
program (``python3 envmerge.py FILE -- python3 -m ...``). It reads the image's environment as it
finds it, composes the final one with :func:`compose`, writes it to the run directory (the run
record shows rank 0's) and ``exec``s the training. Native runs call :func:`compose` in the node
program with the node's environment as the base: one rule everywhere, and no shell between the
values and the process. Stdlib only; it runs under the image's Python as well as the node's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# replace | append | prepend: a spec's env.merge. default: set only where the base leaves the variable
# unset or empty (what env.detect found on a node, for a container: the image's own value wins).
MODES = ("replace", "append", "prepend", "default")
# Words of a variable name that may mean it holds a secret: such a variable is left out of the
# written environment (mxc's record applies its own allow-list and redaction on top).
SECRETISH = frozenset({"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "PWD", "CREDENTIAL",
                       "CREDENTIALS", "APIKEY", "KEY", "AUTH", "COOKIE", "SESSION", "PRIVATE", "SIGNATURE", "SAS",
                       "WEBHOOK", "HOOK"})


def separator(name: str) -> str:
    """Search paths (PATH, LD_LIBRARY_PATH, PYTHONPATH...) join with ':'; flag strings with a space."""
    return ":" if name.endswith("PATH") else " "


def join(name: str, old: str, value: str, mode: str) -> str:
    """``value`` set over ``old``: replaced, joined after (append) or before (prepend) it, or only
    where ``old`` is empty (default). An empty side is not joined (no stray separator)."""
    if mode not in MODES:
        raise ValueError(f"{name}: unknown merge mode {mode!r}")
    if mode == "default":
        return old or value
    if mode == "replace" or not old:
        return value
    if not value:
        return old
    return old + separator(name) + value if mode == "append" else value + separator(name) + old


def apply(base: Mapping[str, str], entries: Sequence[tuple[str, str, str]]) -> dict[str, str]:
    """``base`` with each ``(name, value, mode)`` joined in order, each against the value so far."""
    env = dict(base)
    for name, value, mode in entries:
        env[name] = join(name, env.get(name, ""), value, mode)
    return env


def compose(base: Mapping[str, str], values: Sequence[tuple[str, str]], modes: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the spec's ``values`` set, each as ``modes`` says (replace when it says nothing)."""
    return apply(base, [(name, value, modes.get(name, "replace")) for name, value in values])


def write_request(path: str, entries: Sequence[tuple[str, str, str]], record: str | None,
                  crossed: Mapping[str, Any] | None = None) -> None:
    """The file the in-container step reads: (name, value, mode) in order, where to write the result,
    and which names crossed from the node (``crossed``, written with the result: see write_effective)."""
    _write_json(path, {"env": [list(entry) for entry in entries], "record": record, "crossed": dict(crossed or {})})


def may_be_secret(name: str) -> bool:
    return any(part in SECRETISH for part in name.upper().replace(".", "_").replace("-", "_").split("_"))


def write_effective(path: str, env: Mapping[str, str], crossed: Mapping[str, Any] | None = None) -> None:
    """The environment training starts with, less the variables whose name may mean a secret (mode
    0600; mxc's record keeps an allow-listed, redacted part of it), and ``crossed``: what came from the
    node's environment besides the base (envboundary.crossed: names, and the caller's values less the
    secret-named ones)."""
    data: dict[str, Any] = {"environment": _public(env)}
    for key, value in sorted((crossed or {}).items()):
        data[key] = _public(value) if isinstance(value, Mapping) else sorted(value)
    _write_json(path, data)


def _public(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if not may_be_secret(k)}


def _write_json(path: str, data: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1)
        out.write("\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """``envmerge.py REQUEST -- PROGRAM ARGS...``: compose, record, exec the program."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: envmerge.py REQUEST -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        request = json.load(f)
    env = apply(os.environ, [(str(name), str(value), str(mode)) for name, value, mode in request["env"]])
    if request.get("record"):
        try:
            write_effective(request["record"], env, request.get("crossed"))
        except OSError as exc:  # the record is evidence, not a reason to stop a training
            print(f"mxc: cannot write {request['record']}: {exc}", file=sys.stderr)
    program = argv[2:]
    try:
        os.execvpe(program[0], program, env)
    except OSError as exc:
        print(f"mxc: cannot run {program[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
