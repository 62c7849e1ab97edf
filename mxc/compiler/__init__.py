"""The mxc compiler: spec text in, bundle files out.

A pure pipeline (load -> resolve -> validate -> render -> hash). Reading files is the
caller's job: every function that needs another file (``extends``) takes a ``Reader``.
"""

from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.pipeline import Bundle, compile_document, compile_spec, resolve_spec

__all__ = ["Bundle", "SpecError", "SpecErrors", "compile_document", "compile_spec", "resolve_spec"]
