"""Cluster profiles: which login node, which mxc there, which remote store and runs root.

Kept in ``$MXC_CONFIG/clusters.yaml`` (default ``$XDG_CONFIG_HOME/mxc``, else ``~/.config/mxc``),
never in a spec or a bundle: the same bundle runs on any cluster, and a bundle's hash does not
depend on where it was sent. No secret is stored: authentication is the user's own ssh (config,
agent, keys, ControlMaster), so the file holds names and paths only.

Every value is checked when it is added and again when the file is read (a hand edit is input
too): one line per problem, ``file:line: clusters.NAME.key: what was expected``, exit 2. The file
is rewritten atomically under a lock, so two ``mxc cluster add`` at once lose neither entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.errors import UserError

FORMAT = "mxc-clusters/v1"
FILE_NAME = "clusters.yaml"
CONFIG_VARIABLE = "MXC_CONFIG"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# ssh's destination: [user@]host, host an ssh config alias, a DNS name or an IP address. Never
# starting with '-' (ssh would read an option: -oProxyCommand=...), no spaces or shell syntax.
LOGIN = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,63}@)?[A-Za-z0-9_][A-Za-z0-9._:-]{0,252}\Z")
# A remote path: absolute, ~ or ~/..., or a leading $VAR/${VAR} the login node expands (mxc does
# it there, in Python: nothing of a value ever reaches a shell unquoted).
_REMOTE_PATH_START = re.compile(r"(/|~(/|\Z)|\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)(/|\Z))")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
KEYS = ("login", "mxc", "home", "runs_dir")
HEADER = ("# mxc cluster profiles (mxc cluster add / rm / ls; docs/remote.md). No secrets here: ssh's own\n"
          "# config, agent and keys log in. Values are checked on every read.\n")


@dataclass(frozen=True)
class Cluster:
    """One profile: the login node (ssh destination) and what mxc there is told."""

    name: str
    login: str
    mxc: tuple[str, ...] = ("mxc",)  # the command on the login node, as words (each quoted when sent)
    home: str | None = None  # the remote MXC_HOME (default: the remote mxc's own default, ~/.mxc)
    runs_dir: str | None = None  # the remote MXC_RUNS_DIR (default: $MXC_HOME/runs there)

    def as_dict(self) -> dict[str, Any]:
        return {"login": self.login, "mxc": list(self.mxc), "home": self.home, "runs_dir": self.runs_dir}


def config_dir() -> Path:
    configured = os.environ.get(CONFIG_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base else Path.home() / ".config") / "mxc"


def path() -> Path:
    return config_dir() / FILE_NAME


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UserError(f"'{name[:80]}' is not a cluster name",
                        "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64")
    return name


def problems(name: str, values: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for each bad value of a profile; empty when it is usable."""
    found: list[tuple[str, str]] = []
    if not NAME.match(name):
        found.append(("", "a cluster name is letters, digits, '.', '_' and '-', starting with a letter or digit"))
    for key in values:
        if key not in KEYS:
            found.append((key, f"unknown key (expected one of: {', '.join(KEYS)})"))
    login = values.get("login")
    if not isinstance(login, str) or not LOGIN.match(login):
        found.append(("login", "expected an ssh destination, user@host or a Host alias of your ssh config "
                               "(letters, digits, '.', '_', '-', ':'; not starting with '-')"))
    words = values.get("mxc", ["mxc"])
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words) \
            or any(_CONTROL.search(w) for w in words):
        found.append(("mxc", "expected the command that runs mxc on the login node, as a list of non-empty words "
                             "without control characters (e.g. [/opt/mxc/bin/mxc] or [python3, -m, mxc])"))
    for key in ("home", "runs_dir"):
        value = values.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or _CONTROL.search(value) or not _REMOTE_PATH_START.match(value):
            found.append((key, "expected a path on the login node: absolute, ~/..., or starting with $VAR/ "
                               "(expanded there, e.g. $SCRATCH/mxc-runs); no control characters"))
    return found


def make(name: str, login: str, mxc: str | None, home: str | None, runs_dir: str | None) -> Cluster:
    """A profile from ``mxc cluster add``'s arguments; UserError (exit 2) naming each bad value."""
    check_name(name)
    try:
        words = shlex.split(mxc) if mxc is not None else ["mxc"]
    except ValueError as exc:
        raise UserError(f"--mxc {mxc!r}: {exc}", "the command as words, e.g. --mxc '/opt/mxc/bin/mxc'") from None
    values: dict[str, Any] = {"login": login, "mxc": words, "home": home, "runs_dir": runs_dir}
    bad = problems(name, values)
    if bad:
        option = {"": "NAME", "login": "LOGIN", "mxc": "--mxc", "home": "--home", "runs_dir": "--runs-dir"}
        raise UserError("; ".join(f"{option.get(key, key)}: {what}" for key, what in bad))
    return Cluster(name, login, tuple(words), home, runs_dir)


def load() -> dict[str, Cluster]:
    """Every profile of the file (none when it does not exist); SpecErrors (exit 2) when it is bad."""
    from mxc.compiler.errors import SpecError, SpecErrors
    from mxc.compiler.loader import load_yaml
    from mxc.fsutil import read_text

    file = path()
    try:
        text = read_text(file)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}") from None
    shown = str(file)
    doc = load_yaml(shown, text)
    errors: list[SpecError] = []

    def line(*key: str | int) -> int | None:
        where = doc.lines.get(tuple(key))
        return where[1] if where else None

    if doc.data.get("schema") != FORMAT:
        errors.append(SpecError(shown, line("schema"), "schema", f"expected '{FORMAT}'"))
    for key in doc.data:
        if key not in ("schema", "clusters"):
            errors.append(SpecError(shown, line(key), key, "unknown key (expected schema and clusters)"))
    entries = doc.data.get("clusters") or {}
    if not isinstance(entries, dict):
        errors.append(SpecError(shown, line("clusters"), "clusters", "expected a mapping of cluster names"))
        entries = {}
    found: dict[str, Cluster] = {}
    for name, values in entries.items():
        if not isinstance(values, dict):
            errors.append(SpecError(shown, line("clusters", name), f"clusters.{name}", "expected a mapping"))
            continue
        bad = problems(name, values)
        for key, what in bad:
            at = line("clusters", name, key) if key else line("clusters", name)
            errors.append(SpecError(shown, at or line("clusters", name), f"clusters.{name}" + (f".{key}" if key else ""),
                                    what, f"fix it, or remove the profile: mxc cluster rm {name}"))
        if not bad:
            found[name] = Cluster(name, values["login"], tuple(values.get("mxc", ["mxc"])), values.get("home"),
                                  values.get("runs_dir"))
    if errors:
        raise SpecErrors(errors)
    return found


def get(name: str) -> Cluster:
    check_name(name)
    clusters = load()
    if name not in clusters:
        from mxc.compiler.errors import did_you_mean

        known = ", ".join(sorted(clusters)) or "none yet"
        hint = did_you_mean(name, clusters) or f"clusters: {known}; add one with: mxc cluster add {name} user@login"
        raise UserError(f"no cluster named '{name}' in {path()}", hint)
    return clusters[name]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer at a time: read, change and rewrite the file under an exclusive lock."""
    directory = config_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f".{FILE_NAME}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc.strerror or exc}", code=1) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(clusters: dict[str, Cluster]) -> None:
    import yaml

    from mxc.errors import cannot_write
    from mxc.fsutil import write_atomic

    data = {"schema": FORMAT, "clusters": {name: clusters[name].as_dict() for name in sorted(clusters)}}
    text = HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    try:
        write_atomic(path(), text)
    except OSError as exc:
        raise cannot_write(str(path()), exc) from None


def add(cluster: Cluster, replace: bool) -> bool:
    """Store ``cluster``; True when it replaced a profile of that name (only with ``replace``)."""
    with _locked():
        clusters = load()
        existed = cluster.name in clusters
        if existed and not replace and clusters[cluster.name] != cluster:
            raise UserError(f"cluster '{cluster.name}' exists ({clusters[cluster.name].login})",
                            f"replace it with: mxc cluster add {cluster.name} ... --replace")
        clusters[cluster.name] = cluster
        _write(clusters)
    return existed


def remove(name: str) -> Cluster:
    with _locked():
        cluster = get(name)
        clusters = load()
        del clusters[name]
        _write(clusters)
    return cluster
