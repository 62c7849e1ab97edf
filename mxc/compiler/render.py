"""Resolved spec -> bundle files (text), through jinja2 templates.

One Environment, ``StrictUndefined`` (a missing variable is a bug, never an empty string),
and one quoting filter, ``sq``, for every value that reaches a shell script.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import jinja2

from mxc.compiler.alert_rules import ALERT_RULES, render_rules
from mxc.compiler.contract_build import build_contract
from mxc.compiler.precompiled import PrecompiledLoader
from mxc.compiler.schema import JobSpec
from mxc.node.contract import RunContract
from mxc.node.envmerge import separator
from mxc.node.typed import to_compact_dict

TEMPLATE_VERSION = "2"
NODE_PACKAGE = "mxc_node"  # the node program's directory in every bundle (mxc/node/*.py, verbatim)


def sq(value: object) -> str:
    """Single-quote for POSIX shells: the result is always one inert word, even for ``$(..)`` or newlines."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


_ENV = jinja2.Environment(
    loader=PrecompiledLoader("mxc.compiler", "templates"),  # no cache outside the package: see precompiled.py
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    # Bash's ${#array[@]} would open a jinja comment.
    comment_start_string="{##",
    comment_end_string="##}",
)
_ENV.filters["sq"] = sq


def env_words(contract: RunContract) -> list[tuple[str, str]]:
    """(name, shell word) for env.sh: each value quoted, joined with the value already in the shell as
    run.json's env_merge says (what envmerge.py does with the image's), so sourcing it does the same."""
    modes = dict(contract.env_merge)
    out = []
    for name, value in contract.env:
        sep = separator(name)
        mode = modes.get(name, "replace")
        if mode != "replace" and not value:
            out.append((name, f'"${{{name}:-}}"'))  # nothing to join: the value already there stays
        elif mode == "append":
            out.append((name, f'"${{{name}:+${name}{sep}}}"' + sq(value)))
        elif mode == "prepend":
            out.append((name, sq(value) + f'"${{{name}:+{sep}${name}}}"'))
        else:
            out.append((name, sq(value)))
    return out


def node_program() -> dict[str, str]:
    """mxc/node/*.py as bundle files ``mxc_node/<name>.py``: the node program, verbatim, under the bundle hash."""
    package = resources.files("mxc.node")
    return {f"{NODE_PACKAGE}/{entry.name}": entry.read_text("utf-8")
            for entry in sorted(package.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".py") and entry.is_file()}


def render(spec: JobSpec, spec_json: str, extra_files: dict[str, str] | None = None,
           config_keys: Mapping[str, Any] | None = None) -> dict[str, str]:
    """All bundle files but the manifest, by name. ``config_keys``: those of model.config_file."""
    contract = build_contract(spec, config_keys or {})
    context = {"spec": spec, "contract": contract, "template_version": TEMPLATE_VERSION, "node_package": NODE_PACKAGE,
               "env_words": env_words(contract)}
    files = {
        "spec.json": spec_json,
        "run.json": canonical_json(to_compact_dict(contract)),
        "env.sh": _ENV.get_template("env.sh.j2").render(context),
        "entrypoint.sh": _ENV.get_template("entrypoint.sh.j2").render(context),
        "job.sbatch": _ENV.get_template("job.sbatch.j2").render(context),
        **node_program(),
    }
    if spec.observability.enabled:
        files["prometheus.yml"] = _ENV.get_template("prometheus.yml.j2").render(context)
        if spec.observability.alerts.enabled:
            files[ALERT_RULES] = render_rules(spec.observability)
        files["exporter.json"] = canonical_json(
            {
                "bind": spec.observability.bind,
                "port": spec.observability.exporter_port,
                "plugins": spec.observability.plugins,
                "scrape_interval": spec.observability.scrape_interval,
                **({"peak_tflops": spec.observability.peak_tflops} if spec.observability.peak_tflops else {}),
            }
        )
    files.update(extra_files or {})
    return files
