"""The ``Backend`` contract (mxc/runtime/backends.py): both backends satisfy it, an unknown name is one
line, and a third backend is one class registered in ``BACKENDS`` that ``mxc cancel``, ``mxc show``
and ``mxc runs`` use through it (no dispatch on the backend's name in between)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxc.cli.main import main
from mxc.errors import UserError
from mxc.runtime import backends, runs
from mxc.runtime.backends import Backend, Plan, RunRequest, get_backend
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir, new_run_id
from tests.conftest import REPO, Mxc

BUNDLE = "ab" * 32
CALLS: list[tuple[str, str]] = []  # (method, run id) the fake backend was asked


class FakeBackend:
    """A third backend in one class: its runs end as soon as they are asked to."""

    name = "fake"

    def plan(self, request: RunRequest) -> Plan:
        run = backends.allocate_run_dir(request)
        return Plan(self.name, run, ["true"], {}, run.path)

    def submit(self, request: RunRequest, plan: Plan) -> RunRecord:
        record = backends.first_record(request, plan, "queued")
        backends.create_run_dir(plan.run_dir, record, request.bundle)
        return record

    def status(self, run: RunDir) -> RunRecord:
        CALLS.append(("status", run.run_id))
        record = RunRecord.load(run.record)
        record.status = "running"
        return record

    def cancel(self, run: RunDir) -> RunRecord:
        CALLS.append(("cancel", run.run_id))
        record = RunRecord.load(run.record)
        record.status, record.final, record.ended, record.cancelled_by = "cancelled", True, now_iso(), "mxc cancel"
        record.save(run.record)
        return record

    def logs(self, run: RunDir) -> list[Path]:
        return [run.log]


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_registered_backends_satisfy_the_contract(name: str) -> None:
    backend = get_backend(name)
    assert isinstance(backend, Backend)
    assert backend.name == name
    for method in ("plan", "submit", "status", "cancel", "logs"):
        assert callable(getattr(backend, method)), f"{name} lacks {method}"


def test_a_class_missing_a_method_is_not_a_backend() -> None:
    # FakeBackend's own methods, all but cancel
    no_cancel = type("NoCancel", (), {m: getattr(FakeBackend, m) for m in ("name", "plan", "submit", "status", "logs")})
    assert not isinstance(no_cancel(), Backend)
    assert isinstance(FakeBackend(), Backend)


def test_unknown_backend_is_one_line(mxc_home: Path, mxc: Mxc) -> None:
    with pytest.raises(UserError) as caught:
        get_backend("kubernetes")
    assert str(caught.value) == "unknown backend 'kubernetes' (known: local, slurm)"
    # A run whose record names a backend this mxc lacks: `mxc cancel` says so in one line, exit 2.
    run = RunDir(mxc_home / "runs" / new_run_id(BUNDLE))
    run.path.mkdir(parents=True)
    RunRecord(run_id=run.run_id, bundle=BUNDLE, spec_name="x", backend="kubernetes", status="running",
              started=now_iso()).save(run.record)
    proc = mxc("cancel", run.run_id)
    assert proc.returncode == 2
    assert proc.stderr == "mxc: error: unknown backend 'kubernetes' (known: local, slurm)\n"
    assert not RunRecord.load(run.record).final


def test_logs_of_both_backends_are_the_runs_train_log(tmp_path: Path) -> None:
    run = RunDir(tmp_path / new_run_id(BUNDLE))
    for name in backends.BACKENDS:
        assert get_backend(name).logs(run) == [run.path / "train.log"]


def test_a_third_backend_is_one_class(mxc_home: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(backends.BACKENDS, "fake", f"{__name__}:FakeBackend")
    CALLS.clear()
    backend = get_backend("fake")
    assert isinstance(backend, FakeBackend)

    # submit: the shared helpers give it a run directory with its bundle and a first record like every backend's
    from mxc.build import compile_file
    from mxc.store import Store

    compiled = compile_file(str(REPO / "specs" / "tiny.yaml"))
    bundle, _ = Store(mxc_home).put(compiled.files, compiled.hash)
    request = RunRequest(home=mxc_home, bundle=bundle, spec={}, labels=("third",))
    monkeypatch.setattr(RunRequest, "spec_name", property(lambda self: "fake-spec"))
    plan = backend.plan(request)
    record = backend.submit(request, plan)
    run = plan.run_dir
    assert run.path.parent == mxc_home / "runs"
    saved = RunRecord.load(run.record)
    assert (saved.backend, saved.status, saved.labels, saved.spec_name) == ("fake", "queued", ["third"], "fake-spec")
    assert saved.run_id == record.run_id == run.run_id and run.run_id.endswith(bundle.hash[:8])
    assert (run.path / "bundle" / "manifest.json").is_file()

    # status: the readers ask the backend (a pure read: record.json keeps "queued")
    assert runs.current(run).status == "running"
    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["status"]) for r in listed] == [(run.run_id, "running")]
    assert RunRecord.load(run.record).status == "queued"

    # cancel: `mxc cancel` goes through the record's backend
    assert main(["cancel", run.run_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert ("cancel", run.run_id) in CALLS
    assert RunRecord.load(run.record).final
    assert main(["cancel", run.run_id]) == 2  # already ended: one line, the backend is not asked again
    assert "already ended (cancelled)" in capsys.readouterr().err
    assert [c for c in CALLS if c[0] == "cancel"] == [("cancel", run.run_id)]


@pytest.mark.parametrize("backend, cancelled_by, code, expected", [
    ("local", "SIGINT", -2, 130),  # Ctrl-C in `mxc run`
    ("local", "SIGTERM", -15, 143),
    ("local", "SIGHUP", None, 129),
    ("local", "SIGINT", 143, 130),  # the training's own exit after the supervisor stopped it: who cancelled wins
    ("local", "mxc cancel", None, 143),  # a lost local run closed by `mxc cancel` (mxc/runtime/local/cancel.py)
    ("slurm", "mxc cancel", 143, 143),  # mxc/runtime/slurm/backend.py
    ("slurm", "mxc cancel", None, 143),
    ("slurm", None, 143, 143),  # scancel from outside: the job's own 128+SIGTERM
    ("slurm", None, 137, 137),
    ("slurm", None, 1, 130),  # no signal in the exit code: as Ctrl-C
    ("slurm", None, None, 130),
])
def test_a_cancelled_run_exits_128_plus_the_signal(backend: str, cancelled_by: str | None, code: int | None,
                                                   expected: int) -> None:
    """`mxc run`/`mxc wait` of a cancelled run: `mxc cancel` is 143 on both backends (docs/runs.md)."""
    from mxc.runtime.waiting import Outcome, exit_status

    record = RunRecord(run_id="20260101-000000-0000-00000000", bundle=BUNDLE, spec_name="x", backend=backend,
                       started=now_iso(), final=True, status="cancelled", cancelled_by=cancelled_by, exit_code=code)
    assert backends.exit_code(record) == expected
    assert exit_status(Outcome(record, "cancelled")) == expected
