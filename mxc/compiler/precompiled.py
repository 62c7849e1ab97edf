"""Templates compiled ahead of time and shipped in the package: no template cache in ``$MXC_HOME``.

Parsing the jinja2 templates costs a build ~20 ms per process. The bytecode cache that used to
save it lived in ``$MXC_HOME/cache`` and was loaded with ``marshal``, covered by no hash: anyone
able to write MXC_HOME ran code in every ``mxc build``. Instead, ``tools/gen_compiled_templates.py``
writes the Python source jinja2 generates for each template into ``data/compiled_templates.json``,
which is part of mxc like any of its modules (the package's own integrity covers it).

Each entry records the sha256 of its template's source, and the file records the jinja2 version
and the environment options that shape parsing. A template whose source, jinja2 or options differ
is compiled from source (slower, same output), and ``tests/test_attacks_store.py`` fails until the
file is regenerated. Output is the same either way (tested on every shipped spec).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, MutableMapping
from importlib import resources
from typing import Any

import jinja2

DATA = "compiled_templates.json"
FORMAT = "mxc-compiled-templates/v1"


def options(env: jinja2.Environment) -> dict[str, Any]:
    """What changes the generated code besides the template source and jinja2's version."""
    return {
        "block": [env.block_start_string, env.block_end_string],
        "variable": [env.variable_start_string, env.variable_end_string],
        "comment": [env.comment_start_string, env.comment_end_string],
        "line": [env.line_statement_prefix, env.line_comment_prefix],
        "trim_blocks": env.trim_blocks, "lstrip_blocks": env.lstrip_blocks,
        "keep_trailing_newline": env.keep_trailing_newline, "newline_sequence": env.newline_sequence,
        "autoescape": bool(env.autoescape), "optimized": env.optimized,
        "extensions": sorted(env.extensions),
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generate(env: jinja2.Environment) -> dict[str, Any]:
    """The data file's content: every template of ``env``'s loader compiled to Python source."""
    assert env.loader is not None
    templates = {}
    for name in env.loader.list_templates():
        source, _, _ = env.loader.get_source(env, name)
        templates[name] = {"source_sha256": _sha256(source), "code": env.compile(source, name, None, raw=True)}
    return {"format": FORMAT, "jinja2": jinja2.__version__, "options": options(env), "templates": templates}


def _shipped() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(resources.files("mxc.compiler").joinpath("data", DATA).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data


class PrecompiledLoader(jinja2.PackageLoader):
    """A PackageLoader that takes a template's code from the shipped data when it is current."""

    def __init__(self, package_name: str, package_path: str) -> None:
        super().__init__(package_name, package_path)
        self._data: dict[str, Any] | None = None

    def _current(self, env: jinja2.Environment) -> dict[str, Any]:
        if self._data is None:
            data = _shipped()
            fresh = (data.get("format") == FORMAT and data.get("jinja2") == jinja2.__version__
                     and data.get("options") == json.loads(json.dumps(options(env))))
            self._data = data.get("templates", {}) if fresh else {}
        return self._data

    def load(self, environment: jinja2.Environment, name: str,
             globals: MutableMapping[str, Any] | None = None) -> jinja2.Template:
        source, filename, uptodate = self.get_source(environment, name)
        entry = self._current(environment).get(name)
        if not isinstance(entry, dict) or entry.get("source_sha256") != _sha256(source):
            return super().load(environment, name, globals)
        code = compile(str(entry["code"]), filename or name, "exec")
        ready: Callable[[], bool] | None = uptodate
        return environment.template_class.from_code(environment, code, globals if globals is not None else {}, ready)

    def stale(self, env: jinja2.Environment) -> list[str]:
        """Templates whose shipped code is missing or out of date (they compile from source)."""
        current = self._current(env)
        return sorted(name for name in self.list_templates()
                      if not isinstance(current.get(name), dict)
                      or current[name].get("source_sha256") != _sha256(self.get_source(env, name)[0]))
