"""``model.config_file``: a MaxText YAML beside the spec, carried into the bundle.

MaxText-Slurm keeps one MaxText config per model (``configs/<model>.gpu.yml``, with
``base_config: base.yml``). A spec names such a file; the compiler reads it through the same
confined Reader as ``extends`` (the spec's repository, a regular file, bounded size), parses it
with the spec loader's strict YAML reader (no aliases, bounded), and places its text in the bundle
as ``model/<name>``, so the manifest hashes it and the bundle hash changes with any byte of it. The
node program copies it into the run directory and passes it to MaxText as its config; MaxText
resolves its ``base_config`` against the configs of the MaxText that runs (the file's own directory
holds no ``base.yml``), and ``model.overrides`` on the command line apply on top.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from mxc.compiler.errors import SpecErrors
from mxc.compiler.loader import Loaded, decode, load_yaml
from mxc.compiler.resolve import SET_SOURCE, Reader, ReadRefused

BUNDLE_DIR = "model"
KEY = ("model", "config_file")


def bundle_name(path: str) -> str:
    """Where the file lies in the bundle (and in the run directory): ``model/<its name>``."""
    return f"{BUNDLE_DIR}/{posixpath.basename(path)}"


def source_path(doc: Loaded, spec_path: str, relative: str) -> tuple[str, str, int | None]:
    """(the file to read, the spec file that named it, its line): relative to the spec that set the key
    (an ``extends`` parent names files beside itself), or to the top spec for ``--set``."""
    file, line = doc.lines.get(KEY, (spec_path, 0))
    base = spec_path if file == SET_SOURCE else file
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), relative)), file, line or None


@dataclass(frozen=True)
class ConfigFile:
    """model.config_file as read: its place in the bundle, its text, and its keys (for the decisions
    the compiler takes from them: steps, hardware)."""

    name: str
    text: str
    keys: dict[str, Any]
    lines: dict[Any, tuple[str, int]]  # (key,) -> (the file as read, line), for findings inside it


def read_config(doc: Loaded, spec_path: str, relative: str, model_name: str, read: Reader,
                checkpoint_period: int = 0) -> ConfigFile:
    """``model.config_file``, read and checked; SpecErrors at the key's line when it cannot be read, is
    not a YAML mapping, names another model than ``model.model_name``, or turns checkpointing on while
    the spec does not (mxc passes enable_checkpointing from checkpoint.period, which would win)."""
    target, file, line = source_path(doc, spec_path, relative)
    key = ".".join(KEY)
    try:
        raw = read(target)
    except ReadRefused as exc:
        raise SpecErrors.one(file, line, key, f"{relative}: {exc.message}", exc.suggestion) from None
    except FileNotFoundError:
        raise SpecErrors.one(file, line, key, f"file not found: {target}",
                             "model.config_file is relative to the spec that names it") from None
    except OSError as exc:
        raise SpecErrors.one(file, line, key, f"cannot read {target}: {exc.strerror or exc}") from None
    text = decode(target, raw)
    loaded = load_yaml(target, text)  # its own errors name the config file and line
    data = loaded.data
    named = data.get("model_name")
    if named is not None and str(named) != model_name:
        raise SpecErrors.one(file, line, key, f"{relative} sets model_name '{named}' but model.model_name is "
                             f"'{model_name}' (mxc passes model.model_name, which would win)",
                             f"set model.model_name: {named}")
    wants = data.get("enable_checkpointing") is True
    if wants and not checkpoint_period:
        period = data.get("checkpoint_period")
        raise SpecErrors.one(file, line, key, f"{relative} sets enable_checkpointing: true but checkpoint.period is 0 "
                             "(mxc passes enable_checkpointing from checkpoint.period, which would win)",
                             f"set checkpoint.period: {period}" if isinstance(period, int) else "set checkpoint.period")
    return ConfigFile(bundle_name(relative), text, data, dict(loaded.lines))


def config_keys(text: str, name: str = "config file") -> dict[str, Any]:
    """The file's keys and values (for ``mxc diff``); {} when it is not a readable mapping."""
    try:
        return load_yaml(name, text).data
    except SpecErrors:
        return {}
