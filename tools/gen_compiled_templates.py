"""Regenerate mxc/compiler/data/compiled_templates.json from mxc/compiler/templates/*.j2
(see mxc/compiler/precompiled.py): run it after editing a template or upgrading jinja2.

    python tools/gen_compiled_templates.py
"""

from __future__ import annotations

import json
import pathlib

from mxc.compiler.precompiled import DATA, generate
from mxc.compiler.render import _ENV

OUT = pathlib.Path(__file__).resolve().parents[1] / "mxc" / "compiler" / "data" / DATA

if __name__ == "__main__":
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(generate(_ENV), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(OUT)
    print(f"wrote {OUT}")
