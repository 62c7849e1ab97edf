"""Resolve lockfiles/requirements-*.in into hashed lockfiles/requirements-*.txt with pip.

    python tools/pin_requirements.py                    # every lockfiles/requirements-*.in
    python tools/pin_requirements.py lockfiles/requirements-cuda.in

Run it with the Python 3.12 the images use (the venv's): pip resolves for the interpreter
that runs it (CPython 3.12, Linux x86-64). Review the diff, then re-run `mxc lock` on the
specs: their locks record each file's sha256, so `mxc build --locked` notices the change.
"""

from __future__ import annotations

import pathlib
import sys

from mxc.fsutil import write_atomic
from mxc.lock.requirements import describe, parse, pin

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The set-up locks (what scripts/setup.sh installs) are resolved by tools/lock_setup.sh with uv.
SETUP_LOCKS = frozenset({"requirements-mxc.in", "requirements-dev.in"})


def main(argv: list[str]) -> int:
    sources = [pathlib.Path(a).resolve() for a in argv] or sorted(
        p for p in (ROOT / "lockfiles").glob("requirements-*.in") if p.name not in SETUP_LOCKS)
    for source in sources:
        text = pin(source)
        reqs, problems = parse(text)
        if problems:
            print("\n".join(describe(source.name, p) for p in problems), file=sys.stderr)
            return 1
        out = source.with_suffix(".txt")
        write_atomic(out, text)
        print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {len(reqs)} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
