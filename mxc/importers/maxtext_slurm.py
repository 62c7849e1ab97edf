"""MaxText-Slurm's model config and env files -> an mxc spec (``mxc import maxtext-slurm``).

MaxText-Slurm (github.com/AMD-AGI/maxtext-slurm) runs the MaxText inside a ``rocm/jax-training``
image with ``configs/<model>.gpu.yml`` as its config, after sourcing ``train_env.sh`` (and
``configs/<model>.env.sh`` when there is one). The importer reads those files as data, never runs
them: the config file travels verbatim (``model.config_file``); from the env files it takes what a
plain reading determines, at the top level of the script:

- ``export NAME=value`` (also ``NAME=value`` then ``export NAME``) -> ``env.vars``, the text as the
  shell would give it (quotes removed; ``${NAME:-default}`` -> its default);
- ``XLA_FLAGS`` appends (``XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--flag=v"``, ``"$XLA_FLAGS --flag=v"``,
  ``XLA_FLAGS+=" --flag=v"``) -> ``env.xla_flags``, each value as XLA reads it (``=''`` is empty).

Everything else (conditionals, functions, heredocs, ``source``, values computed from other
variables or commands) is reported as not imported, with its line and why, never guessed at.
Pure functions: the CLI (mxc/cli/importing.py) reads and writes the files.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from mxc.compiler.errors import printable

# What MaxText-Slurm runs: the image its container_env.sh names and where MaxText lives in it.
DEFAULT_IMAGE = "docker.io/rocm/jax-training:maxtext-v26.2"
IMAGE_WORKDIR = "/workspace/maxtext"
IMAGE_MODULE = "MaxText.train"
# The MaxText key catalog that stands in for the ROCm images' MaxText (docs/check.md).
IMAGE_MAXTEXT_CATALOG = "maxtext-pr2879-f37ef2b8547b"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^(export\s+)?({_NAME})=(.*)$")
_EXPORT_ONLY = re.compile(rf"^export\s+({_NAME}(\s+{_NAME})*)$")
_XLA_APPEND = re.compile(r'^XLA_FLAGS(\+=|=)"(\$\{XLA_FLAGS:\+\$XLA_FLAGS \}|\$XLA_FLAGS |\s*)(.*)"$')
_DEFAULTED = re.compile(rf"^\$\{{({_NAME}):-([^$`\\]*)\}}$")
_FLAG = re.compile(r"^--(xla_[a-z0-9_]+)=(.*)$")
_OPENERS = re.compile(r"(?:^|;|&&|\|\||\bthen|\bdo|\belse)\s*(?:if|for|while|until|case|select)\b")
_CLOSERS = re.compile(r"(?:^|;)\s*(?:fi|done|esac)\b")
_FUNCTION = re.compile(rf"^(function\s+)?{_NAME}\s*\(\)\s*\{{?")
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
# Set by MaxText-Slurm for its own launcher, not for training: what each is in mxc.
LAUNCHER_VARS = {
    "MAXTEXT_PATCH_BRANCH": "MaxText-Slurm checks this branch out inside the container; pin it as code.repo + "
                            "code.ref (then `mxc lock`) instead of code.from_image",
    "MAXTEXT_LD_PRELOAD": "becomes LD_PRELOAD there; set env.vars.LD_PRELOAD with env.allow_dangerous",
    "ENABLE_XLA_DUMP": "rank-0 XLA dumps: env.ranks.'0'.xla_flags.xla_dump_to: '{run_dir}/xla_dump'",
    "ENABLE_RAGGED_ONESHOT_KERNEL": "its effect, the ragged all-to-all XLA flag, is imported when present",
    "USE_RAY": "observability.enabled runs Ray with training",
    "ONE_GPU_PER_PROCESS": "mxc runs one process per node",
}


@dataclass
class Skipped:
    file: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.why}: {self.text}"


@dataclass
class EnvImport:
    """What the env files determine: variables and XLA flags, and every line left out with its reason."""

    vars: dict[str, str] = field(default_factory=dict)
    xla_flags: dict[str, str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined and comments dropped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        try:
            words = shlex.split(line, comments=True, posix=True)
        except ValueError:
            words = [line]
        if not words:
            continue
        out.append((start, _strip_comment(line)))
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def _nesting(line: str) -> int:
    """How much deeper in blocks the shell is after ``line``: ``if``/``for``/... and ``{`` open, ``fi``/
    ``done``/``esac`` and ``}`` close (a one-line ``if ...; fi`` is 0)."""
    depth = len(_OPENERS.findall(line)) - len(_CLOSERS.findall(line))
    if line.endswith("{"):
        depth += 1
    if line.startswith("}") or line.endswith("; }"):
        depth -= 1
    return depth


def _value(raw: str) -> str | None:
    """The value a plain assignment gives, or None when it depends on the shell at run time."""
    try:
        words = shlex.split(raw, posix=True)
    except ValueError:
        return None
    if len(words) > 1:
        return None
    word = words[0] if words else ""
    if raw.startswith("'"):
        return word  # single quotes: literal
    defaulted = _DEFAULTED.match(word)
    if defaulted:
        return defaulted.group(2)
    if any(c in word for c in "$`") or raw.startswith("$("):
        return None
    return word


def _flags(text: str) -> list[tuple[str, str]] | None:
    """``--xla_name=value`` words of an XLA_FLAGS append (whitespace-separated, values verbatim)."""
    out = []
    for word in text.split():
        match = _FLAG.match(word)
        if not match or "$" in word:
            return None
        out.append((match.group(1), _unquoted(match.group(2))))
    return out


def _unquoted(value: str) -> str:
    """XLA strips one pair of quotes around a flag's value (``=''`` is the empty string): so does the import,
    and mxc renders the same value back."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_env(name: str, text: str, into: EnvImport | None = None) -> EnvImport:
    """Read one env file (``train_env.sh`` or ``configs/<model>.env.sh``) into ``into`` (later files win)."""
    result = into if into is not None else EnvImport()
    result.sources.append(name)
    assigned: dict[str, str] = {}
    depth = 0
    block_start = 0
    heredoc: str | None = None
    for number, line in _logical_lines(text):
        if heredoc is not None:
            if line == heredoc:
                heredoc = None
            continue
        here = _HEREDOC.search(line)
        if here:
            result.skipped.append(Skipped(name, number, line, "a heredoc block (not run by default)"))
            heredoc = here.group(1)
            continue
        if depth:
            depth += _nesting(line)
            continue
        if _OPENERS.search(line) or _FUNCTION.match(line):
            result.skipped.append(Skipped(name, number, line, "a conditional block or function (decided at run "
                                                              "time; set what it sets in the spec)"))
            depth = max(_nesting(line), 0)
            block_start = number
            continue
        xla = _XLA_APPEND.match(line)
        if xla:
            if xla.group(1) == "=" and not xla.group(2):
                flags = _flags(xla.group(3))
                if flags is not None and result.xla_flags:
                    result.skipped.append(Skipped(name, number, line, "XLA_FLAGS replaced, not appended to: the "
                                                                      "flags before it are dropped"))
                    result.xla_flags.clear()
            else:
                flags = _flags(xla.group(3))
            if flags is None:
                result.skipped.append(Skipped(name, number, line, "an XLA_FLAGS value computed at run time"))
            else:
                result.xla_flags.update(flags)
            continue
        exported = _EXPORT_ONLY.match(line)
        if exported:
            for var in exported.group(1).split():
                if var == "XLA_FLAGS":
                    continue
                if var in assigned:
                    _take(result, name, number, line, var, assigned[var])
                else:
                    result.skipped.append(Skipped(name, number, line, f"{var} is exported without a value set here"))
            continue
        assign = _ASSIGN.match(line)
        if assign:
            is_export, var, raw = bool(assign.group(1)), assign.group(2), assign.group(3)
            value = _value(raw)
            if value is None:
                result.skipped.append(Skipped(name, number, line, f"{var}'s value is computed at run time"))
            elif is_export:
                _take(result, name, number, line, var, value)
            else:
                assigned[var] = value
            continue
        if line.startswith(("source ", ". ")):
            result.skipped.append(Skipped(name, number, line, "another script (node-detected NCCL settings: "
                                                              "docs/coming-from-maxtext-slurm.md)"))
            continue
        result.skipped.append(Skipped(name, number, line, "a command, not a setting"))
    if depth:
        result.skipped.append(Skipped(name, block_start, "...", "a block that does not end"))
    return result


def _take(result: EnvImport, file: str, number: int, line: str, var: str, value: str) -> None:
    if var in LAUNCHER_VARS:
        result.skipped.append(Skipped(file, number, line, f"a MaxText-Slurm launcher setting ({LAUNCHER_VARS[var]})"))
    elif var.startswith("_"):
        result.skipped.append(Skipped(file, number, line, "a helper variable of the script"))
    else:
        result.vars[var] = value


@dataclass(frozen=True)
class ConfigFacts:
    """What the spec needs from the model config: its model and the numbers mxc itself acts on (steps
    mxc reads from the file itself, mxc/compiler/config_file.py)."""

    model_name: str
    checkpoint_period: int
    nodes: int
    keys: int


def config_facts(data: dict[str, Any]) -> ConfigFacts:
    """From the parsed ``<model>.gpu.yml``: model_name (MaxText's default: 'default'), checkpointing,
    and the nodes the dcn_* parallelism asks for (their product; -1 fills whatever is there, so counts 1)."""
    period = data.get("checkpoint_period") if data.get("enable_checkpointing") is True else 0
    nodes = 1
    for key, value in data.items():
        if key.startswith("dcn_") and key.endswith("_parallelism") and isinstance(value, int) and value > 1:
            nodes *= value
    return ConfigFacts(
        model_name=str(data.get("model_name") or "default"),
        checkpoint_period=period if isinstance(period, int) and not isinstance(period, bool) and period > 0 else 0,
        nodes=nodes,
        keys=len(data),
    )


def _q(value: str) -> str:
    """``value`` as a YAML double-quoted scalar, by PyYAML's own emitter (the library mxc's loader parses
    with): every character that YAML would read otherwise (a newline, ``: ``, ``#``, U+2028, NEL, a
    non-printable one) is escaped, so the spec loads back to exactly this string and nothing more; no
    line folding (the whole value is one line)."""
    return yaml.dump(value, default_style='"', width=2**31, allow_unicode=False).rstrip("\n")


@dataclass(frozen=True)
class SpecInputs:
    name: str
    config_name: str  # the config file's name beside the spec
    config_source: str  # as given on the command line, for the header
    facts: ConfigFacts
    env: EnvImport
    image: str
    digest: str | None
    nodes: int
    container: str


def spec_text(i: SpecInputs) -> str:
    """The spec, laid out for review: where each part came from, in comments."""
    lines = [
        printable(f"# Imported from MaxText-Slurm by `mxc import maxtext-slurm` ({i.config_source}"
                  + (", " + ", ".join(i.env.sources) if i.env.sources else "") + ")."),
        "# The model config travels verbatim (model.config_file); the env files' settings are below.",
        "schema: mxc/v1",
        f"name: {_q(i.name)}",
        f"description: {_q('MaxText-Slurm configuration ' + i.config_name)}",
        "image:",
        f"  ref: {_q(i.image)}",
    ]
    if i.digest:
        lines.append(f"  digest: {_q(i.digest)}")
    else:
        lines.append("  # digest: `mxc lock` resolves it from the tag (then `mxc build --locked`)")
    lines += [
        "code:",
        "  from_image: true                # the image's own MaxText, pinned by image.digest",
        "  entry:",
        f"    module: {_q(IMAGE_MODULE)}",
        f"    workdir: {_q(IMAGE_WORKDIR)}",
        f"  maxtext_catalog: {_q(IMAGE_MAXTEXT_CATALOG)}   # `mxc check` judges MaxText keys by the image's MaxText",
        "model:",
        f"  model_name: {_q(i.facts.model_name)}",
        f"  config_file: {_q(i.config_name)}",
    ]
    lines.append("env:")
    if i.env.xla_flags:
        lines.append("  xla_flags:")
        lines += [f"    {_q(k)}: {_q(v)}" for k, v in i.env.xla_flags.items()]
    if i.env.vars:
        lines.append("  vars:")
        lines += [f"    {_q(k)}: {_q(v)}" for k, v in i.env.vars.items()]
    if not i.env.xla_flags and not i.env.vars:
        lines[-1] = "env: {}"
    lines += [
        "resources:",
        f"  nodes: {i.nodes}",
        "  gpus_per_node: 8",
        "  gpu_vendor: amd",
        "runtime:",
        "  backend: slurm",
        f"  container: {_q(i.container)}",
    ]
    if i.facts.checkpoint_period:
        lines += ["checkpoint:", f"  period: {i.facts.checkpoint_period}"]
    harmless = harmless_on_amd(i.env.vars)
    if harmless:
        lines += ["check:", "  accept:   # reviewed: the reference sets these on AMD on purpose (`mxc check` says why)"]
        for name in harmless:
            lines += ["    - rule: env-var-vendor", f"      key: {_q('env.vars.' + name)}",
                      "      why: set by MaxText-Slurm for code ported from CUDA; ROCm never reads it"]
    if i.env.skipped:
        lines.append("# Not imported (set what they do in the spec if you need it):")
        for s in i.env.skipped:
            # printable: a comment stays one line, whatever bytes the file or its path held
            lines += [printable(f"#   {s.file}:{s.line}: {s.text[:160]}"), printable(f"#     {s.why}")]
    return "\n".join(lines) + "\n"


def harmless_on_amd(names: Iterable[str]) -> list[str]:
    """The NVIDIA-only variables that the env catalog marks harmless on ROCm: the reference's env
    files set them on AMD on purpose, so the imported spec accepts their warning (check.accept)
    instead of failing every `mxc check` on them."""
    from mxc.compiler.check.catalogs import env_catalog

    cat = env_catalog()
    out = []
    for name in names:
        known = cat.variables.get(name)
        if known is not None and known.vendor == "nvidia" and known.harmless_on_other_vendor:
            out.append(name)
    return out
