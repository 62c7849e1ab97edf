"""Where the node program writes inside a run directory (and where mxc reads it back).

One definition for both sides: mxc's ``RunDir`` (mxc/runtime/rundir.py) names the same paths
through these functions. The layout is a property of the mxc version whose node program is in
the bundle, not of the spec, so it lives here rather than in run.json.
"""

from __future__ import annotations

from pathlib import Path

BATCH_EVENTS = "batch.jsonl"  # the batch side's events (Slurm)
RESUBMIT_REQUEST = "resubmit.request"  # the batch side asks mxc to resubmit (nodes without scontrol)
CANCEL_REQUEST = "cancel.request"  # mxc cancel: never resubmit
RANK_EVENTS = "events.jsonl"
PREFLIGHT = "preflight.json"
DETECTED = "detected.json"  # env.detect: what each detector read and set on this rank (detect.py)
TRAINER = "trainer.json"  # the rank's running trainer: pid, start time, node (mxc stacks finds it by this)
ENVIRONMENT = "environment.json"  # the environment the rank's training started with (envmerge.py)
LAUNCH = "launch.json"  # how the rank started training: the command, the optional mounts skipped


def rank_dir(run: Path, rank: int) -> Path:
    """Per-rank files: events.jsonl, preflight.json, kernel.<attempt>.log."""
    return run / "ranks" / str(rank)


def rank_events(run: Path, rank: int) -> Path:
    return rank_dir(run, rank) / RANK_EVENTS


def preflight_result(run: Path, rank: int) -> Path:
    return rank_dir(run, rank) / PREFLIGHT


def detected(run: Path, rank: int) -> Path:
    return rank_dir(run, rank) / DETECTED


def trainer_record(run: Path, rank: int) -> Path:
    return rank_dir(run, rank) / TRAINER


def environment(run: Path, rank: int) -> Path:
    """The effective environment of the rank's latest training start (the run record shows rank 0's)."""
    return rank_dir(run, rank) / ENVIRONMENT


def launch(run: Path, rank: int) -> Path:
    return rank_dir(run, rank) / LAUNCH


def env_request(run: Path, rank: int, attempt: int) -> Path:
    """What a container's envmerge.py reads: the spec's variables and how they join the image's."""
    return rank_dir(run, rank) / f"env-request.attempt-{attempt}.json"


def batch_events(run: Path) -> Path:
    return run / BATCH_EVENTS


def metrics_file(run: Path, attempt: int, rank: int) -> Path:
    """What MaxText writes in one attempt on one rank (metrics_file=...)."""
    return run / "metrics" / f"attempt-{attempt}.rank-{rank}.jsonl"


def stacks(run: Path) -> Path:
    """Stack dumps: hangs, crash notes, native backtraces."""
    return run / "stacks"


def cores(run: Path) -> Path:
    return run / "cores"


def output(run: Path, configured: str | None) -> Path:
    """MaxText's base_output_directory: checkpoint.dir, else <run>/output."""
    return Path(configured) if configured else run / "output"


def checkpoints(run: Path, configured: str | None) -> Path:
    """MaxText's layout: <base_output_directory>/<run_name>/checkpoints, run_name being the run id."""
    return output(run, configured) / run.name / "checkpoints"


def barrier(run: Path, attempt: int, name: str) -> Path:
    """One file per rank that reached the barrier ``name`` in ``attempt``."""
    return run / "barrier" / f"attempt-{attempt}" / name


def hang_marker(run: Path, attempt: int) -> Path:
    """Written by the rank that first sees a hang; every rank's node program then stops its trainer."""
    return run / "hang" / f"attempt-{attempt}.json"


def image_cache(run: Path) -> Path:
    """Container images (.sif) shared by runs: $MXC_IMAGE_CACHE, else <MXC_HOME>/images."""
    return run.parent.parent / "images"


def jax_cache(run: Path) -> Path:
    return run / "jax_cache"


def observability(run: Path) -> Path:
    return run / "observability"
