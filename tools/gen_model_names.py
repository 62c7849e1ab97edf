"""Regenerate mxc/compiler/data/maxtext_models.json from the installed maxtext package.

MaxText's own ``ModelName`` type is the authority (a models/*.yml file can exist for a
name the config validation rejects). Run with the training venv:
    python tools/gen_model_names.py
"""

import json
import pathlib
import typing

from maxtext.configs import types  # type: ignore[import-untyped]
from maxtext.version import __version__  # type: ignore[import-untyped]

names = sorted(typing.get_args(types.ModelName))
out = pathlib.Path(__file__).resolve().parents[1] / "compiler" / "data" / "maxtext_models.json"
out.write_text(json.dumps({"maxtext_version": __version__, "model_names": names}, indent=1) + "\n")
print(f"{len(names)} model names from maxtext {__version__} -> {out}")
