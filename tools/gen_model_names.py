"""Regenerate compiler/data/maxtext_models.json from the installed maxtext package.

Run with the training venv: python tools/gen_model_names.py
"""

import json
import pathlib

import maxtext  # type: ignore[import-not-found]
from maxtext.version import __version__  # type: ignore[import-not-found]

models = pathlib.Path(maxtext.__file__).parent / "configs" / "models"
names = sorted({p.stem for p in models.glob("*.yml")} | {"default"})
out = pathlib.Path(__file__).resolve().parents[1] / "compiler" / "data" / "maxtext_models.json"
out.write_text(json.dumps({"maxtext_version": __version__, "model_names": names}, indent=1) + "\n")
print(f"{len(names)} model names from maxtext {__version__} -> {out}")
