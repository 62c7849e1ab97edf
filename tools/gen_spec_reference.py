"""Generate docs/spec-reference.md from the spec's pydantic models (the JSON Schema).

    python tools/gen_spec_reference.py          # rewrite the doc
    python tools/gen_spec_reference.py --stdout # print it (the test compares)
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from mxc.compiler.schema import JobSpec

OUT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"


def type_of(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
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


def render() -> str:
    schema = JobSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    head = [
        "# Spec reference (`mxc/v1`)",
        "",
        "Generated from the pydantic models by `tools/gen_spec_reference.py`; `mxc schema` prints the same",
        "as JSON Schema. Unknown keys are errors everywhere. `extends` (a path or list of paths, relative to",
        "the spec) merges parent specs first: mappings merge key by key, later wins; lists and scalars are",
        "replaced whole. `mxc build SPEC --set key.path=value` overrides any field (the value is read as YAML).",
        "",
    ]
    return "\n".join(head + section("JobSpec", schema, defs, ""))


if __name__ == "__main__":
    text = render()
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}")
