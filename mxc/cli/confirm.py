"""Ask before a cluster submission: one screen of what would be spent, then y/N.

Why: ``mxc run`` is one letter from ``mxc runs`` and defaults to the last built bundle, so a
typo could submit a 64-GPU job. A cluster run therefore shows its size (nodes x GPUs,
partition, time limit, image, code, bundle) and waits for ``y`` unless ``-y`` was given.
Without a terminal nobody can answer: the run is refused unless ``-y`` says so up front, and
a run of the *last built* bundle (no bundle named) is refused there even with ``-y``, because
a script should say which bundle it submits. Local runs are never asked about.
"""

from __future__ import annotations

import sys
from typing import TextIO

from mxc.errors import UserError
from mxc.node.contract import RunContract
from mxc.store import StoredBundle


def _duration(seconds: int) -> str:
    if not seconds:
        return "none (the partition's default)"
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _image(contract: RunContract) -> str:
    c = contract.container
    if c.kind == "native":
        python = c.python + (f", maxtext {c.maxtext_version}" if c.maxtext_version else "")
        return f"native ({python})"
    digest = f"@{c.image_digest[:19]}" if c.image_digest else " (no digest pinned)"
    return f"{c.kind} {c.image_ref or '?'}{digest}"


def _code(contract: RunContract) -> str:
    code = contract.code
    if code.repo and code.commit:
        return f"{code.repo} @ {code.commit[:12]}"
    if code.from_image:
        digest = (contract.container.image_digest or "")[:19]
        return f"the image's MaxText ({contract.container.image_ref}@{digest})"
    if code.maxtext_version:
        return f"maxtext {code.maxtext_version} (installed release)"
    return "the installed maxtext (not pinned)"


def summary(bundle: StoredBundle, contract: RunContract, backend: str, run_id: str, named: bool) -> str:
    """The one screen shown before submitting: everything that decides what the job costs."""
    gpus = contract.preflight.expected_gpus
    size = f"{contract.nodes} node(s) x {gpus} GPU(s) = {contract.nodes * gpus} GPUs" if gpus else \
        f"{contract.nodes} node(s), no GPUs"
    which = "" if named else "  (the last built bundle: no bundle was named)"
    rows = [
        ("bundle", f"{bundle.hash[:12]} ({contract.name}){which}"),
        ("nodes", size),
        ("partition", contract.slurm.partition or "the cluster's default"),
        ("time limit", _duration(contract.slurm.time_limit_s)),
        ("image", _image(contract)),
        ("code", _code(contract)),
        ("restarts", f"up to {contract.restart.max}"),
        ("run", run_id),
    ]
    lines = [f"mxc: about to submit to {backend}:"]
    lines += [f"  {key:<11} {value}" for key, value in rows]
    return "\n".join(lines)


def confirm_submission(bundle: StoredBundle, contract: RunContract, backend: str, run_id: str, *, named: bool,
                       yes: bool, stdin: TextIO | None = None, stream: TextIO | None = None) -> bool:
    """True to go on, False when the user said no; UserError (exit 2) when nobody can be asked.

    Nothing has been written when this runs (planning has no side effects), so a refusal or a
    "no" leaves no run behind.
    """
    stdin = stdin or sys.stdin
    stream = stream or sys.stderr
    interactive = stdin.isatty()
    if not interactive and not named:
        raise UserError(f"refusing to submit the last built bundle ({bundle.hash[:12]}, {contract.name}, "
                        f"{contract.nodes} node(s)) without a terminal to confirm on",
                        f"name the bundle: mxc run {bundle.hash[:12]} -y")
    if yes:
        return True
    if not interactive:
        raise UserError(f"refusing to submit {bundle.hash[:12]} ({contract.name}) to {backend} without confirmation: "
                        "stdin is not a terminal", "pass -y (--yes) to submit without asking")
    stream.write(summary(bundle, contract, backend, run_id, named) + "\nSubmit? [y/N] ")
    stream.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")
