"""Generate docs/spec-reference.md from the spec's pydantic models (the JSON Schema).

    python tools/gen_spec_reference.py          # rewrite the doc
    python tools/gen_spec_reference.py --stdout # print it (the test compares)
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from mxc.compiler import container_policy, env_policy, limits
from mxc.compiler.schema import RESERVED_OVERRIDES, JobSpec
from mxc.node import envboundary

OUT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"


def type_of(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(type_of(p, defs) for p in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in prop:
        return f"mapping to {type_of(prop['additionalProperties'], defs)}"
    if "pattern" in prop:
        return f"{kind} matching `{prop['pattern']}`"
    return str(kind)


def section(name: str, model: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    lines = [f"## `{path or 'top level'}` ({name})", ""]
    if model.get("description"):
        lines += [" ".join(model["description"].split()), ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    required = set(model.get("required", []))
    nested: list[tuple[str, str]] = []
    for key, prop in model.get("properties", {}).items():
        kind = type_of(prop, defs)
        default = "required" if key in required else f"`{json.dumps(prop.get('default'))}`" if "default" in prop else ""
        desc = prop.get("description", "")
        ref = prop.get("$ref") or next((p.get("$ref") for p in prop.get("anyOf", []) if "$ref" in p), None)
        if ref:
            nested.append((f"{path}.{key}" if path else key, ref.rsplit("/", 1)[-1]))
            desc = desc or defs[ref.rsplit("/", 1)[-1]].get("description", "").split("\n")[0]
        lines.append(f"| `{key}` | {kind.replace('|', '&#124;')} | {default} | {desc} |")
    lines.append("")
    for sub_path, ref_name in nested:
        lines += section(ref_name, defs[ref_name], defs, sub_path)
    return lines


def _names(names: frozenset[str], prefixes: tuple[str, ...]) -> str:
    return ", ".join([f"`{n}`" for n in sorted(names)] + [f"`{p}*`" for p in prefixes])


def input_rules() -> list[str]:
    """What mxc refuses in any spec, whatever the field: limits, characters, files, variables."""
    lines = [
        "## Input rules (every spec, base spec, sweep file and `--set` value)",
        "",
        "A spec may come from a colleague or a pull request, so mxc reads it as hostile input: a problem is one",
        "`file:line: key: message` line and exit 2, never a traceback, and nothing is written.",
        "",
        "**Limits** (`mxc/compiler/limits.py`; a reviewed spec is a few kilobytes, four levels deep):",
        "",
        "| limit | value |",
        "|---|---|",
        *[f"| {what} | {value} |" for what, value in limits.described()],
        "",
        "**YAML**: no aliases (`*a`), merge keys (`<<`) or tags (`!x`, `!!python/...`; only `!!str`); keys are",
        "strings; numbers are finite (no `.inf`/`.nan`). **Characters**: no control characters (values may",
        "hold tab and newline; keys none), no lone surrogates, and in the file itself no character YAML reads",
        "as a line break but editors and diffs do not (a lone CR, NEL, U+2028, U+2029) and no bidi control",
        "(U+202A..U+202E, U+2066..U+2069): what a reviewer sees is what mxc reads. Error messages print any",
        "control character of a key or value escaped (`\\n`, `\\x1b`), so one error stays one line.",
        "",
        "**Files**: `extends` (and a sweep's `spec:`) reach only files of the spec's repository: the git work",
        "tree holding the spec, else the spec's own directory, and of the directories of `MXC_SPEC_PATH`",
        "([shared bases](#shared-bases)). Paths are relative (an absolute one is refused),",
        "resolved with symlinks followed, then checked; only regular files are read (no FIFO, device or",
        "directory), at most the size limit, and at most the number of files above. A file outside is refused",
        "before it is opened, so no line of it ever appears in a message or a CI annotation.",
        "",
        "**Environment variables** (`env.vars`, `mxc/compiler/env_policy.py`):",
        "",
        "- refused, no opt-in (bash or Slurm act on them: startup files, prompts, options, exported functions,",
        f"  their own state): {_names(env_policy.REFUSED_NAMES, env_policy.REFUSED_PREFIXES)}, and `MXC_*`;",
        "- dangerous (the loader, an interpreter or the container runtime loads code or files of its choosing):",
        f"  {_names(env_policy.DANGEROUS_NAMES, env_policy.DANGEROUS_PREFIXES)} (not "
        f"{_names(env_policy.SAFE_CONTAINER_SETTINGS, ())}). A spec sets one only by also listing it in",
        "  `env.allow_dangerous`; `mxc check` then reports it (note `env-dangerous`), `mxc build` and",
        "  `mxc show` print it, and spec.json in the bundle holds it;",
        "- also dangerous, each for its own reason: libraries that load a shared object the value names",
        f"  ({_names(frozenset(env_policy.CODE_LOADING), ())}, and `NCCL_*_PLUGIN`/`RCCL_*_PLUGIN` when the value",
        "  is a path: a plain plugin name is looked up on the library search path), and variables that name a",
        f"  command a tool runs ({_names(env_policy.COMMANDS, env_policy.COMMAND_PREFIXES)});",
        f"- search paths {_names(env_policy.SEARCH_PATHS, ())}: allowed; every entry is an absolute directory,",
        f"  and one that is, or is under, a directory every user can write ({', '.join(env_policy.WORLD_WRITABLE)})",
        "  needs `env.allow_dangerous` like a dangerous variable;",
        f"- noted (warning `env-noted`, acceptable with `check.accept`): {_names(frozenset(env_policy.NOTED), ())}:",
        "  traffic through a proxy, another TLS trust store, temporary files elsewhere;",
        "- `APPTAINERENV_X` and `SINGULARITYENV_X` set `X` in the container and are judged as `X`.",
        "",
        "**Passed variables** (`env.pass`, `mxc/node/envboundary.py`): nothing of the caller's environment reaches",
        "the training but the base every process needs "
        f"({_names(frozenset(envboundary.CALLER_NAMES), envboundary.CALLER_PREFIXES)}), the scheduler's "
        f"({_names(frozenset(), envboundary.SCHEDULER_PREFIXES)}), the GPU visibility",
        f"({_names(frozenset(envboundary.GPU_VISIBILITY), ())}) and the names `env.pass` lists",
        "([runs.md](runs.md#what-reaches-the-training)). A passed name is judged like an `env.vars` name (refused ones",
        "cannot be passed; dangerous ones need `env.allow_dangerous` too); `MXC_*`, a base variable and a name",
        "listed twice are refused. The record keeps the names (values only when the name does not mean a secret).",
        "",
        "**Container options that reach the host** (`runtime.container_options`, `runtime.mounts`,",
        "`runtime.optional_mounts`; `mxc/compiler/container_policy.py`): a spec gives one only by also listing it",
        "in `runtime.allow_dangerous` as `field:value` (`cap_add:SYS_ADMIN`, `devices:/dev/sda`,",
        "`group_add:docker`, `mounts:/:/host`, `optional_mounts:/dev:/dev`); `mxc check` then reports it (note",
        "`container-dangerous`), `mxc build` and `mxc show` print it, and spec.json holds it:",
        "",
        f"- capabilities: every one but {_names(container_policy.HARMLESS_CAPABILITIES, ())}, and `ALL`;",
        "  a name Linux does not have is refused;",
        "- devices (and mounts of paths under `/dev`): every one but GPU, RDMA and accelerator devices",
        "  (`/dev/infiniband`, `/dev/kfd`, `/dev/dri`, `/dev/nvidia*`, `/dev/gdrdrv`, `/dev/accel`, `/dev/neuron*`)",
        "  and `/dev/fuse`, `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`, `/dev/shm`,",
        "  `/dev/hugepages`: raw memory (`/dev/mem`, `/dev/kmem`, `/dev/port`, `/dev/cpu/*`), disks and",
        "  partitions, and any other device; a device or mount path that is not canonical (`.`, `..`, `//`, a",
        "  trailing `/`) is refused whatever the opt-in;",
        f"- mounts of the host's `/`, `/dev`, {_names(frozenset(container_policy.SYSTEM_PATHS), ())} or below, `/home`",
        f"  or a whole home directory, a path through {_names(container_policy.CREDENTIAL_DIRS, ())}, or a socket",
        "  (`*.sock`, `*.socket`);",
        f"- groups {_names(container_policy.DANGEROUS_GROUPS, ())} and the gids fixed for them by Debian/Ubuntu or",
        f"  Fedora ({', '.join(f'`{g}`' for g in container_policy.DANGEROUS_GIDS)}); any other number is the site's.",
        "",
        "**MaxText keys mxc sets itself** are refused in `model.overrides` (mxc passes its own value after",
        "the spec's, which would silently win):",
        "",
        "| key | instead |",
        "|---|---|",
        *[f"| `{key}` | {instead} |" for key, instead in RESERVED_OVERRIDES.items()],
        "",
        "`hardware` and `enable_autocheckpoint` are the spec's to set: mxc adds `hardware=gpu` and (with",
        "checkpointing) `enable_autocheckpoint=true` to multi-node runs only when the spec does not set them.",
        "",
        "**Container arguments**: `runtime.mounts` and `checkpoint.dir` hold no `,` (Apptainer's `--bind` would",
        "read a second, read-write mount after it), no `:` inside a path, and no whitespace; `image.ref` does not",
        "start with `-` (`apptainer exec` and `podman run` would take it as an option).",
        "",
    ]
    return lines


def render() -> str:
    schema = JobSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    head = [
        "# Spec reference (`mxc/v1`)",
        "",
        "Generated from the pydantic models by `tools/gen_spec_reference.py`; `mxc schema` prints the same",
        "as JSON Schema (editors: [below](#editor-support)). Unknown keys are errors everywhere. `extends` (a",
        "path or list of paths, relative to the spec, or `base:NAME`, a [shared base](#shared-bases)) merges",
        "parent specs first: mappings merge key by key, later wins; lists and scalars are",
        "replaced whole. A key set to `null` in the extending spec removes what a parent set (an inherited",
        "override or variable; nothing else can drop one); `null` for a key no parent sets is validated like",
        "any value (an error where a value is needed). `mxc build SPEC --set key.path=value` overrides any",
        "field (the value is read as YAML; `--set key.path=null` removes the key, `--set key.path=` sets an",
        "empty string). An empty string",
        "reaches MaxText as an empty string: `profiler: \"\"` is passed as `profiler=''` (MaxText's command",
        "line reads `profiler=` as None), as are the texts `null` and `~`. `mxc init` writes a first spec",
        "([guide](guide.md)). What mxc refuses in any spec whatever the field (limits, files, variables,",
        "container options): [input rules](#input-rules-every-spec-base-spec-sweep-file-and---set-value), after",
        "the field tables.",
        "",
    ]
    return "\n".join(head + section("JobSpec", schema, defs, "") + shared_bases() + editor_support()
                     + run_time_placeholders() + input_rules())


def shared_bases() -> list[str]:
    """``extends: base:NAME`` and MXC_SPEC_PATH (mxc/specfiles.py)."""
    return [
        "## Shared bases",
        "",
        "`extends: base:NAME` names a base spec on the search path `MXC_SPEC_PATH`, which the user sets",
        "outside any spec (directories separated by `:`, searched in order, like `PATH`), so a team keeps one",
        "`cuda.yaml` for specs in every repository:",
        "",
        "```yaml",
        "# ~/team-specs/cuda.yaml, with export MXC_SPEC_PATH=~/team-specs",
        "extends: base:cuda.yaml      # the first directory of MXC_SPEC_PATH that has cuda.yaml",
        "name: my-run",
        "```",
        "",
        "NAME is a `.yaml`/`.yml` file relative to a search directory (subdirectories allowed, no `..`, not",
        "absolute). A plain path in `extends` is never looked up on the search path: `base:` says which is",
        "meant. The base is read like a repository base: its real path must be inside its search directory",
        "(a symlink out is refused before it is opened), a regular file, at most the size limit; its own",
        "`extends` are relative to it (and stay inside the search directory) or `base:` again. What the base",
        "holds is merged into the resolved spec, so it is in the bundle's `spec.json` and its hash: the same",
        "base found in another directory gives the same bundle, an edited base another one. Where it was",
        "found is not in the bundle (no build-machine paths); errors name the file where it was read.",
        "",
    ]


def editor_support() -> list[str]:
    """The yaml-language-server modeline that ``mxc init`` writes (mxc/cli/init.py)."""
    return [
        "## Editor support",
        "",
        "`mxc schema > specs/mxc-spec.schema.json` writes the JSON Schema of this page beside the specs. A spec",
        "whose first line is `# yaml-language-server: $schema=mxc-spec.schema.json` (a path relative to the",
        "spec) gets completion, hovers and errors in editors that use the YAML language server (VS Code's YAML",
        "extension, Neovim, Helix, Zed). `mxc init` writes that line and, when the file is not there yet, the",
        "schema beside the spec it writes; regenerate it with `mxc schema` after upgrading mxc. The line is a",
        "comment: mxc ignores it, and it is no part of the bundle or its hash.",
        "",
    ]


def run_time_placeholders() -> list[str]:
    """The names the node program fills into values (mxc/node/placeholders.py), as a table."""
    from mxc.node.placeholders import PLACEHOLDERS

    lines = [
        "## Run-time placeholders",
        "",
        "Values of `env.vars`, `env.xla_flags`, `env.ranks` and `model.overrides` may name what is only known",
        "on the node, as `{name}`; the node program fills them in before training starts (no shell is",
        "involved, so the result is one string whatever it holds). `{{` and `}}` are literal braces; a lone",
        "brace or an unknown name is a spec error at its line. The bundle keeps the template: the same bundle",
        "gives each run, rank and attempt its own value. `env.sh` shows the variables every rank shares;",
        "`run.json` (`rank_env`) holds the whole environment of each rank `env.ranks` names.",
        "",
        "| placeholder | value |",
        "|---|---|",
    ]
    lines += [f"| `{{{name}}}` | {what} |" for name, what in PLACEHOLDERS.items()]
    return [*lines, ""]


if __name__ == "__main__":
    text = render()
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}")
