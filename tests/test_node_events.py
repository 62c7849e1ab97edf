"""One definition, two strict readers: the contract (run.json) and the event lines, written by the
node program's dataclasses and read back both by its stdlib reader (typed.py) and by pydantic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from mxc.compiler import compile_spec
from mxc.node import contract, events
from mxc.node.typed import InvalidData, from_dict, to_compact_dict
from mxc.runtime import contract as mxc_contract
from mxc.runtime.slurm.events import BATCH_ADAPTER, RANK_ADAPTER, read_events
from tests.conftest import RUNNABLE_SPECS


def compiled(spec: Path) -> str:
    return compile_spec(str(spec), lambda p: Path(p).read_bytes(), mxc_version="test").files["run.json"]


@pytest.mark.parametrize("spec", RUNNABLE_SPECS, ids=lambda p: p.stem)
def test_contract_round_trip(spec: Path) -> None:
    """compiler -> run.json -> the node's reader == pydantic's reader, and back to the same JSON."""
    text = compiled(spec)
    node_side = contract.parse(text)
    mxc_side = mxc_contract.parse(text)
    assert node_side == mxc_side
    assert json.loads(text) == json.loads(json.dumps(to_compact_dict(node_side)))
    assert node_side.format == contract.FORMAT and [s.name for s in node_side.stages] == [
        "preflight", "image", "barrier", "train"]


def test_contract_values_come_from_the_spec() -> None:
    tiny = contract.parse(compiled(next(s for s in RUNNABLE_SPECS if s.stem == "tiny")))
    assert tiny.restart.max == 2 and tiny.restart.final_step == 29 and tiny.checkpoint.period == 10
    assert tiny.hang.init_timeout_s == 1800 and tiny.hang.step_timeout_s == 900
    assert ("JAX_PLATFORMS", "cpu") in tiny.env and tiny.container.kind == "native"
    assert tiny.stage("train").grace_s == 300 and tiny.stage("barrier").timeout_s == tiny.stage("image").timeout_s
    assert "--signal=B:USR2@300" in tiny.slurm.directives and tiny.slurm.time_limit_s == 0
    big = contract.parse(compiled(next(s for s in RUNNABLE_SPECS if s.stem == "70b")))
    assert big.slurm.time_limit_s == 12 * 3600 and "--nodes=8" in big.slurm.directives
    assert big.train.distributed_args == ["skip_jax_distributed_system=false", "hardware=gpu", "enable_autocheckpoint=true"]
    causes = {p.cause for p in big.infrastructure}
    assert {"nccl_error", "node_failure"} <= causes and not causes & {"config_error", "python_exception", "device_oom"}
    assert {p.blame for p in big.infrastructure} <= {"node", "network", "scheduler"}


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(extra=1), "extra: unknown key"),
    (lambda d: d.pop("hang"), "hang: missing"),
    (lambda d: d["restart"].update(max="3"), "restart.max: expected int, got str"),
    (lambda d: d["restart"].update(checkpointing=1), "restart.checkpointing: expected bool, got int"),
    (lambda d: d["restart"].update(max=True), "restart.max: expected int, got a boolean"),
    (lambda d: d["env"].append(["ONLY_NAME"]), "env[9]: expected a list of 2 items"),
    (lambda d: d["stages"][0].update(name=None), "stages[0].name: expected str, got NoneType"),
])
def test_both_readers_refuse_what_does_not_match(change: Any, message: str) -> None:
    data = json.loads(compiled(next(s for s in RUNNABLE_SPECS if s.stem == "70b")))
    change(data)
    text = json.dumps(data)
    with pytest.raises(contract.ContractError, match=message.replace("[", r"\[").replace("]", r"\]")):
        contract.parse(text)
    with pytest.raises(ValidationError):
        mxc_contract.parse(text)


def test_another_format_version_is_refused() -> None:
    data = json.loads(compiled(RUNNABLE_SPECS[0]))
    data["format"] = "mxc-contract/v0"
    with pytest.raises(contract.ContractError, match="format 'mxc-contract/v0', this node program reads mxc-contract/v1"):
        contract.parse(json.dumps(data))


# ---- events


def examples() -> list[Any]:
    common: dict[str, Any] = {"time": 1700000000.5, "job_id": "42", "attempt": 1}
    rank: dict[str, Any] = {**common, "rank": 1, "node": "node2"}
    return [
        events.BatchStart(**common, slurm_restart_count=1, resubmits=0, restart_max=2, nodes="node[1-2]", num_nodes=2,
                          partition="debug", batch_host="node1", coordinator="127.0.0.1:23456"),
        events.Refused(**common, slurm_restart_count=3, resubmits=0, why="restart 3 is past restart.max (2)"),
        events.SignalReceived(**common, signal="USR2", cause="time_limit", time_left=280.0),
        events.Decision(**common, cause="hang", action="requeue", reason="hang: restart 2 of at most 2, from checkpoint 5",
                        checkpoint=5, rank=1, node="node2", detail="init: no progress for 31s"),
        events.Requeue(**common, action="requeued", why="hang", checkpoint=5),
        events.Terminated(**common, signal="SIGTERM"),
        events.End(**common, rc=0),
        events.RankStart(**rank, nprocs=2, coordinator="127.0.0.1:23456", pid=99, interface="eth0", interface_reason="x"),
        events.StageStart(**rank, stage="image", timeout_s=900),
        events.StageEnd(**rank, stage="image", rc=0, seconds=1.25, timed_out=False, detail=None),
        events.ImageReady(**rank, image="/c/x.sif", action="cached", seconds=0.5),
        events.BarrierPassed(**rank, name="ready", ranks=2, waited_s=3.0),
        events.HangDetected(**rank, phase="init", idle_seconds=31.0, limit_s=30, detected_by=0, pid=1234,
                            stacks=["/r/stacks/hang.rank-1.attempt-1-pid1234.txt"]),
        events.RankExit(**rank, stage="train", rc=137, timed_out=False, cause="hang", detail=None, last_step=None),
    ]


@pytest.mark.parametrize("event", examples(), ids=lambda e: type(e).__name__)
def test_event_round_trip(event: Any, tmp_path: Path) -> None:
    """write -> one JSON line -> the node's reader and pydantic both give the same event back."""
    batch = isinstance(event, events.BATCH_EVENTS)
    path = tmp_path / ("batch.jsonl" if batch else "events.jsonl")
    events.append(path, event)
    text = path.read_text()
    assert text.count("\n") == 1 and text.startswith('{"event": "' + event.event + '"')
    node_read, problems = events.read(path, events.BATCH_EVENTS if batch else events.RANK_EVENTS)
    assert problems == [] and node_read == [event]
    adapter: TypeAdapter[Any] = BATCH_ADAPTER if batch else RANK_ADAPTER
    assert adapter.validate_json(text.strip()) == event


def test_invalid_lines_are_reported_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = examples()[-1]
    events.append(path, good)
    with open(path, "a") as fh:
        fh.write('{"event": "exit", "rank": "1"}\n')  # wrong type, missing fields
        fh.write("not json\n")
        fh.write('{"event": "teleport", "time": 1}\n')
        fh.write('{"event": "exit", "partial')  # being written: no newline yet, not a problem
    found, problems = events.read(path, events.RANK_EVENTS)
    assert found == [good]
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "unknown event 'teleport'" in problems[2]
    mxc_found, mxc_problems = read_events(path, RANK_ADAPTER)
    assert mxc_found == [good] and len(mxc_problems) == 3 and mxc_problems[0].startswith("events.jsonl:2: ")


def test_typed_reader_knows_literals_optionals_and_nesting() -> None:
    assert from_dict(events.End, {"event": "end", "time": 1, "job_id": "", "attempt": 0, "rc": 2}).time == 1.0
    with pytest.raises(InvalidData, match="event: expected one of"):
        from_dict(events.End, {"event": "start", "time": 1, "job_id": "", "attempt": 0, "rc": 2})
    with pytest.raises(InvalidData, match="time_left: expected float, got str"):
        from_dict(events.SignalReceived, {"time": 1, "job_id": "", "attempt": 0, "signal": "USR2", "cause": "x",
                                          "time_left": "soon"})
