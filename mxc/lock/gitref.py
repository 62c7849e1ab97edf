"""Resolve a branch or tag of a git repository to its commit, like ``git ls-remote``.

Works for URLs and local paths alike and clones nothing. An annotated tag resolves to the
commit it points at (the peeled ``^{}`` entry), not to the tag object.
"""

from __future__ import annotations

import os
import re

from mxc.compiler.gitrepo import git_env, last_line, repo_problem
from mxc.errors import UserError

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolve_ref(repo: str, ref: str, timeout: float = 60) -> str:
    """The 40-hex commit ``ref`` (branch, tag, full ref name, or a commit) names in ``repo``."""
    if _COMMIT.match(ref):
        return ref
    if problem := repo_problem(repo):
        raise UserError(f"code.repo {repo!r} {problem}", "give a path or an https/ssh URL of a git repository")
    import git

    try:
        out = str(git.cmd.Git().ls_remote("--", repo, kill_after_timeout=timeout, env=git_env(os.environ)))
    except git.GitError as exc:
        detail = last_line(str(getattr(exc, "stderr", "") or exc))
        raise UserError(f"code.repo {repo!r}: cannot list its refs: {detail}") from None
    refs: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if _COMMIT.match(sha):
            refs[name] = sha
    for candidate in (f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", ref, f"{ref}^{{}}"):
        if candidate in refs:
            return refs[candidate]
    branches = sorted(n.removeprefix("refs/heads/") for n in refs if n.startswith("refs/heads/"))
    raise UserError(f"code.ref {ref!r} is not a branch or tag of {repo}",
                    "branches: " + ", ".join(branches[:8]) if branches else "")
