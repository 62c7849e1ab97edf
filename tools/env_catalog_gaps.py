"""Variables an NCCL or RCCL source tree reads that mxc/compiler/data/env_vars.json lacks.

``mxc check`` warns about an unknown ``NCCL_*``/``RCCL_*`` variable (usually a typo the
library ignores), so the catalog must know every variable the library really reads. The
library says so in its source: ``NCCL_PARAM(Name, "ENV", default)`` and
``RCCL_PARAM(Name, "ENV", default)`` declare an integer parameter read from ``NCCL_ENV`` /
``RCCL_ENV`` (``strtoll``: a non-number is silently 0 or the default), and ``getenv``/
``ncclGetEnv`` read a string. This lists the missing ones with file and line; ``--write``
adds them to the catalog, each citing that line at that commit (kind ``int`` for parameters,
``string`` for the rest). Hand-curated entries are never touched.

    python tools/env_catalog_gaps.py --git /path/to/nccl.git --repo-url https://github.com/NVIDIA/nccl
    python tools/env_catalog_gaps.py --git /path/to/rccl.git --repo-url https://github.com/ROCm/rccl --write
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

CATALOG = pathlib.Path(__file__).resolve().parents[1] / "mxc" / "compiler" / "data" / "env_vars.json"
PARAM = re.compile(r'\b(NCCL|RCCL)_PARAM\(\s*(\w+)\s*,\s*"([A-Z0-9_]+)"\s*,\s*([^)]*)\)')
GETENV = re.compile(r'\b(?:getenv|ncclGetEnv)\(\s*"((?:NCCL|RCCL)_[A-Z0-9_]+)"\s*\)')


@dataclass(frozen=True)
class Read:
    name: str
    kind: str  # int | string
    path: str
    line: int
    default: str = ""


def reads(gitdir: pathlib.Path, commit: str) -> dict[str, Read]:
    out: dict[str, Read] = {}
    grep = subprocess.run(["git", "-C", str(gitdir), "grep", "-n", "-E", r"(NCCL|RCCL)_PARAM\(|getenv\(|ncclGetEnv\(",
                           commit, "--", "src"], capture_output=True, text=True, check=False).stdout
    for line in grep.splitlines():
        _, path, number, text = line.split(":", 3)
        for m in PARAM.finditer(text):
            if m.group(2) == "name":  # the macro's own definition
                continue
            name = f"{m.group(1)}_{m.group(3)}"
            out.setdefault(name, Read(name, "int", path, int(number), m.group(4).strip()))
        for m in GETENV.finditer(text):
            out.setdefault(m.group(1), Read(m.group(1), "string", path, int(number)))
    return out


def entry(read: Read, library: str, url: str) -> dict[str, object]:
    vendor = "amd" if read.name.startswith("RCCL_") else "any"
    if read.kind == "int":
        doc = f"read by {library} as an integer ({read.name.removeprefix('NCCL_').removeprefix('RCCL_')}, default {read.default})"
    else:
        doc = f"read by {library} as a string"
    out: dict[str, object] = {"vendor": vendor, "kind": read.kind, "source": f"{url}#L{read.line}", "doc": doc}
    if vendor == "amd":
        out["harmless_on_other_vendor"] = "NCCL never reads RCCL_* variables"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git", type=pathlib.Path, required=True, help="NCCL or RCCL git repository")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--repo-url", required=True, help="https://github.com/NVIDIA/nccl or https://github.com/ROCm/rccl")
    parser.add_argument("--write", action="store_true", help="add the missing variables to the catalog")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(args.git), "rev-parse", f"{args.commit}^{{commit}}"], capture_output=True,
                            text=True, check=True).stdout.strip()
    library = "RCCL" if "rccl" in args.repo_url.lower() else "NCCL"
    catalog = json.loads(CATALOG.read_text(encoding="utf-8"))
    missing = {n: r for n, r in sorted(reads(args.git, commit).items()) if n not in catalog["variables"]}
    for read in missing.values():
        print(f"{read.name:45} {read.kind:6} {read.path}:{read.line}")
    print(f"{len(missing)} variables of {library} {commit[:12]} are not in {CATALOG.name}", file=sys.stderr)
    if args.write and missing:
        base = args.repo_url.rstrip("/").removesuffix(".git")
        for name, read in missing.items():
            catalog["variables"][name] = entry(read, library, f"{base}/blob/{commit}/{read.path}")
        tmp = CATALOG.with_suffix(".tmp")
        tmp.write_text(dump(catalog), encoding="utf-8")
        tmp.replace(CATALOG)
    return 0


def dump(catalog: dict[str, object]) -> str:
    """The catalog's layout: one line per variable, so diffs stay readable."""
    head = {k: v for k, v in catalog.items() if k != "variables"}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f" {json.dumps(key)}: {json.dumps(value, indent=1, ensure_ascii=False).replace(chr(10), chr(10) + ' ')},")
    lines.append(' "variables": {')
    variables = catalog["variables"]
    assert isinstance(variables, dict)
    items = [f"  {json.dumps(n)}: {json.dumps(v, ensure_ascii=False)}" for n, v in variables.items()]
    lines.append(",\n".join(items))
    lines.append(" }")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
