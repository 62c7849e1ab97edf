"""The run record v2 (mxc/runtime/record.py): every field declared, nothing undeclared accepted,
typed Slurm state, `mxc schema --record`; and every v1 record written by earlier mxc still read
(the recorded runs of tests/fixtures/runs/ and tests/fixtures/triage/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxc.runtime.record import RECORD_VERSION, RunRecord, SlurmState
from tests.conftest import Mxc

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = sorted([*FIXTURES.glob("runs/*/*/record.json"), *FIXTURES.glob("triage/*/record.json")])
# Fixtures recorded before the v2 record (later ones, e.g. triage/device_oom_cpu, are v2 already).
V1_RECORDS = [p for p in RECORDED if json.loads(p.read_text())["format"] == "mxc-run/v1"]


def test_there_are_v1_records_to_read() -> None:
    assert len(V1_RECORDS) >= 10


@pytest.mark.parametrize("path", V1_RECORDS, ids=lambda p: p.parent.name)
def test_a_v1_record_reads_as_v2_with_its_facts(path: Path, tmp_path: Path) -> None:
    data = json.loads(path.read_text())
    record = RunRecord.load(path)
    assert record.format == RECORD_VERSION
    for key in ("run_id", "bundle", "status", "final", "started", "ended", "exit_code", "restarts", "message"):
        assert getattr(record, key) == data.get(key), key
    assert [a.number for a in record.attempts] == [a["number"] for a in data.get("attempts", [])]
    for attempt, old in zip(record.attempts, data.get("attempts", []), strict=True):
        for key in ("cause", "hung", "job_id", "nodes", "exit_code", "reason"):
            if key in old:
                assert getattr(attempt, key) == old[key], key
        if old.get("decision"):
            assert attempt.decision is not None and attempt.decision.action == old["decision"]["action"]
    if isinstance(data.get("slurm"), dict):
        old_slurm = data["slurm"]
        assert isinstance(record.slurm, SlurmState)
        assert record.slurm.job_id == str(old_slurm["job_id"])
        assert [j.job_id for j in record.slurm.jobs] == [str(j["job_id"]) for j in old_slurm.get("jobs", [])]
        if old_slurm.get("first_failure"):
            assert record.slurm.first_failure is not None
            assert record.slurm.first_failure.rank == old_slurm["first_failure"]["rank"]
        dumped = record.model_dump(mode="json")
        assert "log" not in dumped["slurm"]  # v1's train.log cursor is not carried into the record
    # A v1 record read and saved (as a live run's would be) is a valid v2 record.
    record.final = False
    record.save(tmp_path / "record.json")
    assert json.loads((tmp_path / "record.json").read_text())["format"] == RECORD_VERSION
    assert RunRecord.load(tmp_path / "record.json") == record


def test_an_undeclared_field_is_refused(tmp_path: Path) -> None:
    record = RunRecord(run_id="r", bundle="0" * 64, spec_name="t", backend="slurm", status="queued", started="x",
                       slurm=SlurmState(job_id="7"))
    data = record.model_dump(mode="json")
    for where in (data, data["slurm"]):
        where["surprise"] = 1
        (tmp_path / "record.json").write_text(json.dumps(data))
        with pytest.raises(ValueError, match="surprise"):
            RunRecord.load(tmp_path / "record.json")
        del where["surprise"]
    data["format"] = "mxc-run/v9"
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="mxc-run/v9"):
        RunRecord.load(tmp_path / "record.json")


def test_mxc_schema_record_prints_the_records_schema(mxc: Mxc) -> None:
    out = mxc("schema", "--record")
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    assert schema["title"] == f"mxc run record ({RECORD_VERSION})"
    assert set(schema["properties"]) == set(RunRecord.model_fields)
    assert schema["additionalProperties"] is False
    # every model of the record is closed, the Slurm state included
    assert {"Attempt", "SlurmState", "SlurmJob", "FirstFailure", "Decision"} <= set(schema["$defs"])
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values() if "properties" in d)
    assert set(schema["$defs"]["SlurmState"]["properties"]) == set(SlurmState.model_fields)
    assert "mxc schema --record" in mxc("schema", "--help").stdout
