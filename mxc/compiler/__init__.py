"""The mxc compiler: spec text in, bundle files out.

A pure pipeline (load -> resolve -> validate -> render -> hash). Reading files is the
caller's job: every function that needs another file (``extends``) takes a ``Reader``.

The names below load on first use: ``mxc run`` of a built bundle imports one leaf module
(``mxc.compiler.errors``) and must not pay for the pipeline, the schema and the checks
(about 170 ms, most of ``mxc run``'s own import time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mxc.compiler.errors import SpecError, SpecErrors
    from mxc.compiler.pipeline import Bundle, compile_document, compile_spec, resolve_spec

__all__ = ["Bundle", "SpecError", "SpecErrors", "compile_document", "compile_spec", "resolve_spec"]

_HOME = {"SpecError": "errors", "SpecErrors": "errors", "Bundle": "pipeline", "compile_document": "pipeline",
         "compile_spec": "pipeline", "resolve_spec": "pipeline"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
