"""Read ``images/<target>/`` through spython and check what must hold for a pinned image.

spython 0.3.14 parses Containerfiles and Apptainer definitions into one ``Recipe`` shape
(from header, files, environment, install steps, labels), which lets the two files of a
target be compared. Its Singularity parser has quirks that ``DefParser`` corrects: it refuses
any bootstrap but ``docker`` (``scratch`` is valid Apptainer), lower-cases the ``From:`` line
(``{{ BASE_IMAGE }}`` is case-sensitive) and turns ``%setup`` lines into garbage. The checks:
the base is pinned (scratch, or ``BASE_IMAGE`` with no default, filled with a digest at build
time, or a literal ``@sha256:``), every ``pip install`` is ``--require-hashes -r`` the lock
and nothing installs at run time, the requirements file is fully hashed, and the two files
agree on base, environment, copied files and install command.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.errors import UserError
from mxc.lock.requirements import describe, parse

REQUIREMENTS_IN_IMAGE = "/opt/mxc/requirements.txt"
BASE_ARG = "BASE_IMAGE"
_PIP_INSTALL = re.compile(r"\bpip3?(?:\.\d+)?\s+install\b|\s-m\s+pip\s+install\b")


@dataclass(frozen=True)
class Target:
    """One directory of images/: its name, files and what the build context needs."""

    name: str
    directory: Path
    requirements: Path
    rootfs: str | None
    base: str | None

    @property
    def containerfile(self) -> Path:
        return self.directory / "Containerfile"

    @property
    def definition(self) -> Path:
        return self.directory / f"{self.name}.def"


@dataclass
class Parsed:
    """The parts of a recipe that the checks compare, normalised across both formats."""

    base: str
    bootstrap: str
    environ: dict[str, str]
    files: list[tuple[str, str]]
    install: list[str]
    labels: dict[str, str]
    runscript: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)


def load_target(directory: str | Path) -> Target:
    path = Path(directory)
    config = path / "image.toml"
    if not config.is_file():
        raise UserError(f"{path} is not an image directory (no image.toml)", "try images/maxtext-cpu")
    try:
        data = tomllib.loads(config.read_text("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{config}: {exc}") from None
    unknown = sorted(set(data) - {"name", "requirements", "rootfs", "base"})
    if unknown or "name" not in data or "requirements" not in data:
        raise UserError(f"{config}: needs name and requirements (optional: rootfs, base)"
                        + (f"; unknown keys: {', '.join(unknown)}" if unknown else ""))
    if data.get("rootfs") not in (None, "python"):
        raise UserError(f"{config}: rootfs must be \"python\" (a local CPython 3.12) or absent")
    return Target(str(data["name"]), path, (path / str(data["requirements"])).resolve(), data.get("rootfs"),
                  data.get("base"))


def _quiet_spython() -> None:
    """spython warns on stderr about what it cannot convert to the other format; mxc only reads."""
    from spython.logger import bot  # type: ignore[import-untyped]

    bot.level = 0  # QUIET: errors still raise


def _def_parser() -> Any:
    from spython.main.parse.parsers import SingularityParser  # type: ignore[import-untyped]

    _quiet_spython()

    class DefParser(SingularityParser):  # type: ignore[misc]
        """spython's parser with the bootstrap, From-case and %setup quirks fixed (see module doc)."""

        bootstrap = ""
        setup_lines: list[str]

        def _check_bootstrap(self, line: str) -> None:
            match = re.match(r"^bootstrap:\s*(\S+)", line.strip(), re.IGNORECASE)
            if match:
                self.bootstrap = match.group(1).lower()
                if self.bootstrap == "scratch":
                    self.recipe[self.active_layer].fromHeader = "scratch"

        def _load_from(self, line: str) -> None:
            value = re.sub(r"(?i)^from:", "", line.split("#", 1)[0].strip()).strip()
            self.recipe[self.active_layer].fromHeader = value

        def _setup(self, lines: list[str]) -> None:
            self.setup_lines = [*getattr(self, "setup_lines", []), *lines]

    return DefParser


def _pairs(items: list[Any]) -> list[tuple[str, str]]:
    """spython keeps files/labels as "a b" strings or [a, b] lists depending on the direction."""
    out: list[tuple[str, str]] = []
    for item in items:
        parts = item.split(None, 1) if isinstance(item, str) else list(item)
        out.append((str(parts[0]), str(parts[1]).strip().strip('"') if len(parts) > 1 else ""))
    return out


def _environ(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        for key, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', item):
            env[key] = value.strip('"')
    return env


def _runscript(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def parse_definition(path: Path) -> Parsed:
    parser = _def_parser()(str(path))
    stages = parser.recipe
    if len(stages) != 1:
        raise UserError(f"{path}: expected one stage, found {len(stages)}")
    recipe = next(iter(stages.values()))
    return Parsed(
        base=recipe.fromHeader or "", bootstrap=parser.bootstrap, environ=_environ(recipe.environ),
        files=_pairs(recipe.files), install=[str(x) for x in recipe.install],
        labels=dict(_pairs(recipe.labels)), runscript=_runscript(recipe.cmd or recipe.entrypoint),
        setup=list(getattr(parser, "setup_lines", [])),
    )


def parse_containerfile(path: Path) -> Parsed:
    from spython.main.parse.parsers import DockerParser

    _quiet_spython()
    stages = DockerParser(str(path)).recipe
    if len(stages) != 1:
        raise UserError(f"{path}: expected one stage, found {len(stages)}")
    recipe = next(iter(stages.values()))
    # DockerParser files: [[src, dest]] with src made absolute against the cwd; keep the name.
    files = [(Path(src).name if src else src, dest) for src, dest in _pairs(recipe.files)]
    text = path.read_text("utf-8")
    labels = dict(re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', text))
    return Parsed(base=recipe.fromHeader or "", bootstrap="docker", environ=_environ(recipe.environ),
                  files=files, install=[str(x) for x in recipe.install], labels=labels,
                  runscript=_runscript(recipe.cmd or recipe.entrypoint))


def pip_installs(parsed: Parsed) -> list[str]:
    """Every install step that runs pip install, without a RUN --mount prefix or the interpreter."""
    out = []
    for step in parsed.install:
        if _PIP_INSTALL.search(step):
            out.append(re.sub(r"^.*?\bpip3?(?:\.\d+)?\s+install\b", "pip install", re.sub(r"--mount=\S+\s*", "", step)))
    return out


def _base_problems(where: str, parsed: Parsed) -> list[str]:
    base = parsed.base.strip()
    if base == "scratch":
        return []
    if base in (f"${{{BASE_ARG}}}", f"${BASE_ARG}", f"{{{{ {BASE_ARG} }}}}"):
        return []
    if re.search(r"@sha256:[0-9a-f]{64}$", base):
        return []
    return [f"{where}: base image {base!r} is not pinned (use scratch, ${BASE_ARG} or REF@sha256:...)"]


def check_target(target: Target) -> list[str]:
    """Every reason this target would not build a pinned image; empty when it is sound."""
    problems: list[str] = []
    parsed: dict[str, Parsed] = {}
    for path in (target.containerfile, target.definition):
        if not path.is_file():
            problems.append(f"{path}: missing (each target has a Containerfile and {target.name}.def)")
            continue
        try:
            parsed[path.name] = parse_definition(path) if path.suffix == ".def" else parse_containerfile(path)
        except (UserError, ValueError, IndexError, NotImplementedError) as exc:
            problems.append(f"{path}: spython cannot parse it: {exc}")
    for name, recipe in parsed.items():
        where = f"{target.directory / name}"
        problems += _base_problems(where, recipe)
        pips = pip_installs(recipe)
        if not pips:
            problems.append(f"{where}: installs no Python packages from the lock")
        for cmd in pips:
            words = cmd.split()
            if "--require-hashes" not in words:
                problems.append(f"{where}: `{cmd[:60]}...` lacks --require-hashes")
            # Options only, and the one requirements file: no package named outside the lock.
            operands = [w for w in words[2:] if not w.startswith("-") and w != REQUIREMENTS_IN_IMAGE]
            if f"-r {REQUIREMENTS_IN_IMAGE}" not in cmd or operands:
                problems.append(f"{where}: `{cmd[:60]}...` must install only -r {REQUIREMENTS_IN_IMAGE}")
        if any(_PIP_INSTALL.search(line) for line in recipe.runscript):
            problems.append(f"{where}: the runscript installs packages at run time")
        if recipe.labels.get("org.opencontainers.image.title") != target.name:
            problems.append(f"{where}: label org.opencontainers.image.title must be {target.name!r}")
        if ("requirements.txt", REQUIREMENTS_IN_IMAGE) not in recipe.files:
            problems.append(f"{where}: does not copy requirements.txt to {REQUIREMENTS_IN_IMAGE}")
    if len(parsed) == 2:
        cf, df = parsed["Containerfile"], parsed[target.definition.name]
        if cf.environ != df.environ:
            keys = sorted(k for k in set(cf.environ) | set(df.environ) if cf.environ.get(k) != df.environ.get(k))
            problems.append(f"{target.directory}: Containerfile and .def set different environments: {', '.join(keys)}")
        if pip_installs(cf) != pip_installs(df):
            problems.append(f"{target.directory}: Containerfile and .def install differently")
        scratch = (cf.base == "scratch", df.bootstrap == "scratch")
        if scratch[0] != scratch[1] or (not scratch[0] and _base_problems("", cf) != _base_problems("", df)):
            problems.append(f"{target.directory}: Containerfile and .def start from different bases")
        if (target.rootfs is None) == scratch[0]:
            problems.append(f"{target.directory}: image.toml rootfs must be set exactly when the image is FROM scratch")
    if (target.base is None) != (target.rootfs is not None):
        problems.append(f"{target.directory}/image.toml: set either base (a registry image) or rootfs = \"python\"")
    if not target.requirements.is_file():
        problems.append(f"{target.directory}/image.toml: requirements {target.requirements} does not exist")
    else:
        _, unpinned = parse(target.requirements.read_text("utf-8"))
        problems += [describe(str(target.requirements), p) for p in unpinned]
    return problems
