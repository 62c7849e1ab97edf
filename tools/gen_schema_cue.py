"""Regenerate specs/schema.cue from mxc/compiler/schema.py (see mxc.compiler.check.cue_schema).

    python tools/gen_schema_cue.py
"""

from __future__ import annotations

import pathlib

from mxc.compiler.check.cue_schema import job_spec_cue

OUT = pathlib.Path(__file__).resolve().parents[1] / "specs" / "schema.cue"

if __name__ == "__main__":
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(job_spec_cue(), encoding="utf-8")
    tmp.replace(OUT)
    print(f"wrote {OUT}")
