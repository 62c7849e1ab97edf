"""Resolved spec -> bundle files (text), through jinja2 templates.

One Environment, ``StrictUndefined`` (a missing variable is a bug, never an empty string),
and one quoting filter, ``sq``, for every value that reaches a shell script.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from mxc.compiler.precompiled import PrecompiledLoader
from mxc.compiler.schema import JobSpec, Scalar
from mxc.compiler.slurm import slurm_context

TEMPLATE_VERSION = "1"


def sq(value: object) -> str:
    """Single-quote for POSIX shells: the result is always one inert word, even for ``$(..)`` or newlines."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def scalar_text(value: Scalar) -> str:
    """How MaxText and XLA read a value: booleans lower-case, the rest as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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


def xla_flags(spec: JobSpec) -> str:
    return " ".join(f"--{k}={scalar_text(v)}" for k, v in sorted(spec.env.xla_flags.items()))


def environment(spec: JobSpec) -> list[tuple[str, str]]:
    """Every variable env.sh exports, sorted: the spec's vars, XLA_FLAGS, and mxc's own facts."""
    env = {k: scalar_text(v) for k, v in spec.env.vars.items()}
    flags = xla_flags(spec)
    if flags:
        raw = env.get("XLA_FLAGS")
        env["XLA_FLAGS"] = f"{flags} {raw}" if raw else flags
    env["MXC_JOB_NAME"] = spec.name
    return sorted(env.items())


def maxtext_args(spec: JobSpec) -> list[str]:
    """MaxText's argv after the module: config file, model, overrides, checkpointing."""
    args = [f"src/maxtext/configs/{spec.model.config}", f"model_name={spec.model.model_name}"]
    args += [f"{k}={scalar_text(v)}" for k, v in sorted(spec.model.overrides.items())]
    if spec.checkpoint.period:
        args += ["enable_checkpointing=true", f"checkpoint_period={spec.checkpoint.period}"]
    else:
        args += ["enable_checkpointing=false"]
    return args


def render(spec: JobSpec, spec_json: str, extra_files: dict[str, str] | None = None) -> dict[str, str]:
    """All bundle files but the manifest, by name."""
    context = {
        "spec": spec,
        "env": environment(spec),
        "maxtext_args": maxtext_args(spec),
        "template_version": TEMPLATE_VERSION,
        "slurm": slurm_context(spec),
    }
    files = {
        "spec.json": spec_json,
        "env.sh": _ENV.get_template("env.sh.j2").render(context),
        "entrypoint.sh": _ENV.get_template("entrypoint.sh.j2").render(context),
        "preflight.sh": _ENV.get_template("preflight.sh.j2").render(context),
        "job.sbatch": _ENV.get_template("job.sbatch.j2").render(context),
    }
    if spec.observability.enabled:
        files["prometheus.yml"] = _ENV.get_template("prometheus.yml.j2").render(context)
        files["exporter.json"] = canonical_json(
            {
                "bind": spec.observability.bind,
                "port": spec.observability.exporter_port,
                "plugins": spec.observability.plugins,
                "scrape_interval": spec.observability.scrape_interval,
                "hang_timeout": spec.observability.hang_timeout,
            }
        )
    files.update(extra_files or {})
    return files
