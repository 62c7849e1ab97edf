"""Which environment variables a spec may export (``env.vars``), and why.

The node program puts every ``env.vars`` entry into the environment of the training process (and,
for container runs, of the container runtime that starts it); the node program itself runs with
``python3 -E -s`` and never reads them. Some variables are *instructions* to the programs that do
read them, not settings of the training: ``BASH_ENV: "$(cmd)"`` runs ``cmd`` in every bash the
training or a tool it calls starts, ``LD_PRELOAD`` loads a library into every process,
``APPTAINER_BIND`` adds read-write mounts the spec's ``runtime.mounts`` never showed. A reviewer
reading a value does not see that it runs code. Three classes (docs/spec-reference.md lists them):

- **refused**: what bash acts on (bash(1) ENVIRONMENT / Shell Variables: startup files, prompts,
  xtrace, word splitting, exported functions, its own state) and what Slurm gives each task
  (``SLURM_PROCID`` decides the rank): no training needs to set them, so no opt-in exists;
- **dangerous**: what makes the loader, an interpreter or the container runtime load or run code
  or files of its choosing (ld.so(8) and glibc's list of variables it drops for setuid programs,
  python(1) ENVIRONMENT, Perl/Ruby/Node/Java options, Apptainer/Podman configuration, ``PATH``,
  ``HOME``). Each has real uses (``LD_PRELOAD`` of tcmalloc, a site ``PATH``), so a spec may set
  one when it also lists it in ``env.allow_dangerous``: the opt-in is part of the reviewed spec and
  of the bundle hash, ``mxc check`` reports it (rule ``env-dangerous``), ``mxc build`` and
  ``mxc show`` print it;
- **search paths** ``LD_LIBRARY_PATH`` and ``PYTHONPATH``: everyday on clusters, allowed, but every
  entry must be an absolute directory (an empty or relative entry means "the working directory",
  which on a node is the code checkout or wherever the job started).

``APPTAINERENV_X``/``SINGULARITYENV_X`` set ``X`` inside the container, so they are judged as ``X``.
"""

from __future__ import annotations

from collections.abc import Collection

REFUSED_NAMES = frozenset({
    # bash runs or sources these
    "BASH_ENV", "ENV", "PROMPT_COMMAND", "PS0", "PS1", "PS2", "PS3", "PS4",
    # bash options and parsing
    "SHELLOPTS", "BASHOPTS", "IFS", "CDPATH", "GLOBIGNORE", "GLOBSORT", "EXECIGNORE", "FIGNORE", "FUNCNEST",
    "POSIXLY_CORRECT", "TMOUT", "CHILD_MAX", "OPTERR", "OPTIND", "HISTFILE", "HISTCONTROL", "HISTIGNORE",
    "HISTTIMEFORMAT", "INPUTRC", "MAILPATH", "auto_resume", "histchars",
    # bash's own state (read-only, or reset by bash: setting them breaks the scripts)
    "BASHPID", "DIRSTACK", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "FUNCNAME", "GROUPS", "HISTCMD",
    "HOSTNAME", "HOSTTYPE", "LINENO", "MACHTYPE", "MAPFILE", "OLDPWD", "OPTARG", "OSTYPE", "PIPESTATUS",
    "PPID", "PWD", "RANDOM", "REPLY", "SECONDS", "SHLVL", "SRANDOM", "UID", "COPROC",
})
REFUSED_PREFIXES = ("BASH_", "COMP_", "READLINE_", "SLURM_", "SLURMD_", "SRUN_")

DANGEROUS_NAMES = frozenset({
    # glibc: unsecvars.h (dropped for setuid programs because they load code or files)
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
    "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
    # which programs and whose files
    "PATH", "HOME",
    # Python: startup code, another standard library, user site-packages, imports by name
    "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONBREAKPOINT",
    "PYTHONPLATLIBDIR", "PYTHONPYCACHEPREFIX", "PYTHONWARNINGS",
    # other interpreters a script may start
    "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
    # Podman: another configuration, another host
    "CONTAINER_HOST", "CONTAINER_CONNECTION", "DOCKER_HOST",
})
DANGEROUS_PREFIXES = ("LD_", "CONTAINERS_", "APPTAINER_", "SINGULARITY_")
# Apptainer settings that only say where its caches and temporary files go.
SAFE_CONTAINER_SETTINGS = frozenset({
    "APPTAINER_CACHEDIR", "APPTAINER_TMPDIR", "SINGULARITY_CACHEDIR", "SINGULARITY_TMPDIR",
})
SEARCH_PATHS = frozenset({"LD_LIBRARY_PATH", "PYTHONPATH"})
_INNER_PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")


def _inner(name: str) -> str:
    """The variable a name sets where the training runs (APPTAINERENV_X sets X in the container)."""
    for prefix in _INNER_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def refused(name: str) -> bool:
    inner = _inner(name)
    return inner in REFUSED_NAMES or inner.startswith(REFUSED_PREFIXES)


def dangerous(name: str) -> bool:
    inner = _inner(name)
    if inner in SEARCH_PATHS or inner in SAFE_CONTAINER_SETTINGS or refused(name):
        return False
    return inner in DANGEROUS_NAMES or inner.startswith(DANGEROUS_PREFIXES)


def _search_path_problem(name: str, value: str) -> str | None:
    for entry in value.split(":"):
        if not entry.startswith("/"):
            shown = repr(entry) if entry else "an empty entry"
            return (f"{name}: {shown} is not an absolute directory (an empty or relative entry is the working "
                    "directory of the process)")
    return None


def problems(variables: dict[str, str], allowed: list[str], passed: Collection[str] = ()) -> list[tuple[str, str]]:
    """(variable, why it is refused) for ``env.vars`` (name -> value as exported) given ``env.allow_dangerous``
    (which may also name a variable of ``passed``, env.pass: the same opt-in, judged in pass_problems)."""
    out: list[tuple[str, str]] = []
    for name, value in variables.items():
        if refused(name):
            out.append((name, f"{name} is refused: bash, Slurm or mxc act on it before training starts "
                              "(it can run commands or change what the scripts do)"))
        elif dangerous(name) and name not in allowed:
            out.append((name, f"{name} makes the loader, an interpreter or the container runtime load code or files "
                              f"of its choosing; to set it, also list it in env.allow_dangerous"))
        elif _inner(name) in SEARCH_PATHS:
            problem = _search_path_problem(name, value)
            if problem:
                out.append((name, problem))
    for name in allowed:
        if name in passed and name not in variables:
            continue
        if name not in variables:
            out.append((name, f"env.allow_dangerous lists {name}, which neither env.vars sets nor env.pass "
                              "passes (remove it)"))
        elif not dangerous(name):
            out.append((name, f"env.allow_dangerous lists {name}, which needs no opt-in"
                              + (" (and cannot have one: it is refused)" if refused(name) else " (remove it)")))
    return out


def pass_problems(names: list[str], allowed: list[str]) -> list[tuple[str, str]]:
    """(variable, why) for ``env.pass``: what the caller's shell may hand the training is judged like a
    value the spec sets (refused, or dangerous unless opted in), since the spec cannot show the value."""
    out: list[tuple[str, str]] = []
    for name in names:
        if refused(name):
            out.append((name, f"{name} cannot be passed: bash, Slurm or mxc act on it before training starts"
                              + (" (the scheduler's SLURM_* variables reach the training anyway)"
                                 if name.startswith(("SLURM_", "SLURMD_")) else "")))
        elif dangerous(name) and name not in allowed:
            out.append((name, f"{name} makes the loader, an interpreter or the container runtime load code or files "
                              "of its choosing; to pass it, also list it in env.allow_dangerous"))
    return out


def opt_in_notice(names: list[str]) -> str:
    """The line ``mxc build`` and ``mxc show`` print for a spec with an opt-in."""
    return (f"env.allow_dangerous: {', '.join(names)} exported on purpose "
            "(can load or run code the spec does not show; review the values)")
