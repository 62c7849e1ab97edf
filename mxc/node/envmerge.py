"""The training's environment: the spec's variables joined with the image's, composed where
training runs.

A container runtime decides on its own how a variable given on its command line meets the one the
image defines (Podman's and Docker's ``--env`` replace it; under Apptainer the image's wins), so
neither is asked: the node program writes the variables and their merge modes (run.json's
``env_merge``) to a JSON file in the run directory, and starts this file as the container's first
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

MODES = ("replace", "append", "prepend")


def separator(name: str) -> str:
    """Search paths (PATH, LD_LIBRARY_PATH, PYTHONPATH...) join with ':'; flag strings with a space."""
    return ":" if name.endswith("PATH") else " "


def compose(base: Mapping[str, str], values: Sequence[tuple[str, str]], modes: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``values`` set: each replaces, or joins the base's value after (append) or before
    (prepend) it. An empty or missing base value is not joined (no stray separator)."""
    env = dict(base)
    for name, value in values:
        mode = modes.get(name, "replace")
        if mode not in MODES:
            raise ValueError(f"{name}: unknown merge mode {mode!r}")
        old = base.get(name, "")
        if mode == "replace" or not old:
            env[name] = value
        elif not value:
            env[name] = old
        elif mode == "append":
            env[name] = old + separator(name) + value
        else:
            env[name] = value + separator(name) + old
    return env


def write_request(path: str, values: Sequence[tuple[str, str]], modes: Mapping[str, str],
                  record: str | None) -> None:
    """The file the in-container step reads: the variables, their modes, where to write the result."""
    data = {"env": [list(pair) for pair in values], "merge": dict(modes), "record": record}
    _write_json(path, data)


def write_effective(path: str, env: Mapping[str, str]) -> None:
    """The environment training starts with (all of it; mxc's record keeps an allow-listed part)."""
    _write_json(path, {"environment": dict(sorted(env.items()))})


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
    values = [(str(name), str(value)) for name, value in request["env"]]
    env = compose(os.environ, values, request.get("merge") or {})
    if request.get("record"):
        try:
            write_effective(request["record"], env)
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
