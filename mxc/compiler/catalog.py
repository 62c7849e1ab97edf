"""Data shipped with the compiler (generated from real packages, see tools/)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> Any:
    return json.loads(resources.files("mxc.compiler").joinpath("data", name).read_text("utf-8"))


def maxtext_model_names() -> frozenset[str]:
    return frozenset(load("maxtext_models.json")["model_names"])
