"""What ``code.repo`` may be: a git repository as git will read it, never an option or a program.

git reads an argument starting with ``-`` as an option (``--upload-pack=CMD`` runs CMD), a
``transport::address`` as a remote helper (``ext::CMD`` runs CMD), an ssh host starting with
``-`` as an ssh option; a newline splits what logs and error lines show. So a repo is a local
path, a URL whose protocol is in ``ALLOWED_PROTOCOLS``, or an scp-like ``user@host:path``, and
``git_env`` sets ``GIT_ALLOW_PROTOCOL`` to the same list wherever mxc runs git, so git itself
refuses the rest (submodules and redirects included) and never waits for a password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

ALLOWED_PROTOCOLS = ("file", "git", "http", "https", "ssh")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_HELPER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.-]*::")


def repo_problem(repo: str) -> str | None:
    """Why ``repo`` cannot be given to git, or None."""
    if not repo.strip():
        return "empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in repo):
        return "holds a control character (a newline, a tab...)"
    if repo.startswith("-"):
        return "starts with '-', which git would read as an option"
    if _HELPER.match(repo):
        return "is a git remote helper (transport::address), which runs a program"
    if url := _URL.match(repo):
        scheme, rest = url[1].lower(), url[2]
        if scheme not in ALLOWED_PROTOCOLS:
            return f"protocol '{url[1]}' is not allowed (allowed: {', '.join(ALLOWED_PROTOCOLS)})"
        host = rest.split("/", 1)[0].rpartition("@")[2]
        if host.startswith("-"):
            return "its host starts with '-', which ssh would read as an option"
        return None
    head, colon, path = repo.partition(":")
    if colon and "/" not in head:  # scp-like user@host:path (git's rule: a colon before any slash)
        host = head.rpartition("@")[2]
        if not host or host.startswith("-") or path.startswith("-"):
            return "its host or path starts with '-', which ssh or git would read as an option"
    return None


def git_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment for a git command on a spec's repository."""
    return {**base, "GIT_ALLOW_PROTOCOL": ":".join(ALLOWED_PROTOCOLS), "GIT_TERMINAL_PROMPT": "0"}


def last_line(text: str) -> str:
    """The line of git's output that says what went wrong (its last), without GitPython's wrapping."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().strip("'")]
    line = lines[-1] if lines else "git failed"
    return line.removeprefix("stderr:").strip().strip("'")[:300]
