"""Records of format ``mxc-run/v1``, read as v2.

v1 declared fewer fields and allowed undeclared ones: attempts carried ``cause``, ``hung``,
``job_id``, ``decision``, ``requeue``... as extras, the record ``cancelled_by`` and ``preflight``,
and ``slurm`` was a free-form dict holding, among Slurm's state, the train.log parser's cursor
(``slurm.log``). ``upgrade`` maps every field v1 records were written with onto its v2 place and
leaves out the cursor (the Slurm backend re-reads train.log once and keeps its cursor in the run
directory's private ``.log-cursor.json``) and whatever mxc never wrote. Pure: data in, data out;
``RunRecord.parse`` validates the result like any v2 record. Tested on the recorded v1 records of
tests/fixtures/runs/ and tests/fixtures/triage/.
"""

from __future__ import annotations

from typing import Any

FORMAT = "mxc-run/v1"  # also what a record without a format is read as (none was written without one)

_TOP = ("run_id", "bundle", "spec_name", "backend", "status", "final", "started", "ended", "exit_code", "restarts",
        "command", "environment", "host", "code", "image", "steps", "last_loss", "observability", "rerun_of",
        "tensorboard", "supervisor", "message", "cancelled_by", "preflight", "labels", "resumed_from",
        "time_to_first_step_s", "compile_s", "detected", "training")
_ATTEMPT = ("number", "started", "ended", "exit_code", "signal", "reason", "resumed_from_step", "last_step", "cause",
            "hung", "idle_seconds", "stacks", "job_id", "run_of_job", "nodes", "coordinator", "slurm_state")
_DECISION = ("cause", "action", "reason", "rank", "node", "detail")
_REQUEUE = ("cause", "action", "why", "checkpoint")
_SLURM = ("job_id", "exports", "partition", "restart_max", "state", "reason", "source", "nodes", "slurm_restarts",
          "time_left", "restart_count", "resubmits", "coordinator", "batch_host", "node_list", "num_nodes",
          "invalid_events", "exit_code")
_JOB = ("job_id", "submitted", "resubmits", "resubmit_of", "why", "cause")
_FAILURE = ("rank", "node", "stage", "rc", "cause", "timed_out", "why", "detail", "srun")
_TEXT = ("job_id",)  # v1 wrote some job ids as numbers


def _pick(data: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        return {}
    out = {k: data[k] for k in keys if k in data and data[k] is not None}
    for key in _TEXT:
        if key in out and isinstance(out[key], int) and not isinstance(out[key], bool):
            out[key] = str(out[key])
    return out


def _attempt(data: Any) -> dict[str, Any]:
    out = _pick(data, _ATTEMPT)
    if isinstance(data, dict):
        if isinstance(data.get("decision"), dict) and data["decision"]:
            out["decision"] = _pick(data["decision"], _DECISION)
        if isinstance(data.get("requeue"), dict) and data["requeue"]:
            out["requeue"] = _pick(data["requeue"], _REQUEUE)
    return out


def _slurm(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    out = _pick(data, _SLURM)
    out["jobs"] = [_pick(job, _JOB) for job in data.get("jobs") or [] if isinstance(job, dict)]
    out["requeues"] = [{**_pick(entry, (*_REQUEUE, "job_id")), "restart": entry.get("restart", 0)}
                       for entry in data.get("requeues") or [] if isinstance(entry, dict)]
    if isinstance(data.get("first_failure"), dict):
        out["first_failure"] = _pick(data["first_failure"], _FAILURE)
    if isinstance(out.get("exports"), dict):
        out["exports"] = {str(k): str(v) for k, v in out["exports"].items()}
    return out  # "log" (the parser's cursor) and anything else v1 never declared stay behind


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 record's data as v2 data (not yet validated)."""
    out = _pick(data, _TOP)
    out["format"] = "mxc-run/v2"
    out["attempts"] = [_attempt(a) for a in data.get("attempts") or [] if isinstance(a, dict)]
    if "slurm" in data:
        out["slurm"] = _slurm(data["slurm"])
    return out
