"""mxc/node/preflight.py: each node check over fake /proc, /dev and /sys/class/net trees and this
machine's real ones, and preflight.json as mxc's own readers take it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxc.node import preflight
from mxc.runtime.rundir import RunDir
from mxc.runtime.slurm.events import JobFiles, preflight_summary

UID = 1000


# ---- GPUs


@pytest.mark.parametrize(("env", "expected", "ok", "detail"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, True, "expected 2 GPU(s), visible 2 (0,1)"),
    ({"SLURM_STEP_GPUS": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"}, 2, True, "expected 2 GPU(s), visible 2 (2,3)"),
    ({"ROCR_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0"}, 4, True, "expected 4 GPU(s), visible 4 (0,1,2,3)"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-5d0e,MIG-77a1"}, 2, True, "expected 2 GPU(s), visible 2 (MIG-5d0e,MIG-77a1)"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, 8, False, "expected 8 GPU(s), visible 1 (0)"),
    ({"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "0,1"}, 2, False,
     "expected 2 GPU(s), visible 0 (CUDA_VISIBLE_DEVICES is '')"),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 1, False, "expected 1 GPU(s), visible 0 (CUDA_VISIBLE_DEVICES is 'NoDevFiles')"),
])
def test_gpus_from_the_allocation(env: dict[str, str], expected: int, ok: bool, detail: str, tmp_path: Path) -> None:
    check = preflight.check_gpus(expected, "nvidia", env, tmp_path)
    assert (check.check, check.passed, check.detail) == ("gpus", ok, detail)


def test_gpus_from_device_files(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (dev / name).write_text("")
    for name in ("renderD128", "renderD129", "card0", "card1"):
        (dev / "dri" / name).write_text("")
    nvidia = preflight.check_gpus(4, "nvidia", {"SLURM_STEP_GPUS": ""}, dev)
    assert nvidia.passed and nvidia.detail == "expected 4 GPU(s), visible 4 (no allocation variables)"
    amd = preflight.check_gpus(4, "amd", {}, dev)
    assert not amd.passed and amd.detail == "expected 4 GPU(s), visible 2 (no allocation variables)"


def test_gpus_on_this_machine() -> None:
    """No GPU here: a CPU node sees none, and a spec wanting one fails."""
    env = {k: v for k, v in os.environ.items() if k not in preflight.GPU_VARIABLES}
    assert preflight.check_gpus(0, "nvidia", env, Path("/dev")).passed
    assert not preflight.check_gpus(1, "amd", env, Path("/dev")).passed


# ---- stale training processes


def fake_process(proc: Path, pid: int, argv: list[str], env: dict[str, str] | None, uid: int = UID,
                 state: str = "S") -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} (python3 (x)) {state} 1 {pid} {pid} 0 -1 4194560 0 0\n")
    (d / "status").write_text(f"Name:\tpython3\nState:\t{state}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if env is not None:
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def write_record(run: Path, **fields: object) -> str:
    run.mkdir(parents=True, exist_ok=True)
    (run / "record.json").write_text(json.dumps({"run_id": run.name, "status": "running", "final": False, **fields}))
    return str(run)


TRAIN = ["python3", "-m", "maxtext.trainers.pre_train.train", "run_name=x"]


def test_stale_processes_rules(tmp_path: Path) -> None:
    proc, runs = tmp_path / "proc", tmp_path / "runs"
    mine = write_record(runs / "mine")
    ended = write_record(runs / "ended", status="failed", final=True)
    orphaned = write_record(runs / "orphaned", supervisor={"pid": 4242, "host": "node7"})
    supervised = write_record(runs / "supervised", supervisor={"pid": 300, "host": "node7"})
    elsewhere = write_record(runs / "elsewhere", supervisor={"pid": 4242, "host": "login1"})
    zombie_supervisor = write_record(runs / "zsup", supervisor={"pid": 301, "host": "node7"})
    fake_process(proc, 300, ["python", "-m", "mxc", "run"], {})
    fake_process(proc, 301, ["python", "-m", "mxc", "run"], {}, state="Z")
    fake_process(proc, 101, TRAIN, {"MXC_RUN_DIR": mine + "/"})  # ours (path spelled differently)
    fake_process(proc, 102, TRAIN, {"MXC_RUN_DIR": ended})
    fake_process(proc, 103, TRAIN, {"MXC_RUN_DIR": orphaned})
    fake_process(proc, 104, TRAIN, {"MXC_RUN_DIR": supervised})
    fake_process(proc, 105, TRAIN, {"MXC_RUN_DIR": elsewhere})
    fake_process(proc, 106, ["python", "-m", "MaxText.train", "MaxText/configs/base.yml"], {"MXC_RUN_DIR": zombie_supervisor})
    fake_process(proc, 107, TRAIN, {})  # no run directory
    fake_process(proc, 108, TRAIN, {"MXC_RUN_DIR": ended}, uid=UID + 1)  # another user's
    fake_process(proc, 109, TRAIN, {"MXC_RUN_DIR": ended}, state="Z")  # already exited
    fake_process(proc, 110, TRAIN, None)  # environ unreadable
    fake_process(proc, 111, ["python3", "train.py"], {"MXC_RUN_DIR": ended})  # not MaxText
    fake_process(proc, 112, TRAIN, {"MXC_RUN_DIR": str(runs / "no-record")})
    fake_process(proc, 113, TRAIN, {"MXC_RUN_DIR": ended})  # this very process

    def check(in_slurm: bool, exclusive: bool) -> preflight.CheckResult:
        return preflight.check_stale_processes(mine, exclusive, in_slurm, UID, proc, node_names=("node7",),
                                               self_pid=113)

    shared = check(in_slurm=False, exclusive=False)
    assert not shared.passed and shared.detail == (
        f"training processes of other runs: 102 (its run ended (failed): {ended}), "
        f"103 (its run's supervisor (pid 4242) is gone: {orphaned}), "
        f"106 (its run's supervisor (pid 301) is gone: {zombie_supervisor})")
    assert check(in_slurm=True, exclusive=False).detail == shared.detail
    exclusive = check(in_slurm=True, exclusive=True)
    assert [item.split()[0] for item in exclusive.detail.split(": ", 1)[1].split(", ")] == [
        "102", "103", "104", "105", "106", "107", "112"]
    assert "(this job holds the node exclusively)" in exclusive.detail


def test_no_stale_processes(tmp_path: Path) -> None:
    check = preflight.check_stale_processes("/runs/x", True, True, UID, tmp_path / "empty-proc")
    assert check.passed and check.detail == "training processes of other runs: none"


def test_garbage_records_do_not_count(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, content in ((201, b"\x00\xff"), (202, b"[" * 100000), (203, b'["final", true]'), (204, b'{"final": "yes"}')):
        run = tmp_path / f"run{pid}"
        run.mkdir()
        (run / "record.json").write_bytes(content)
        fake_process(proc, pid, TRAIN, {"MXC_RUN_DIR": str(run)})
    assert preflight.check_stale_processes("/runs/x", False, False, UID, proc, node_names=("n",)).passed


def test_stale_process_on_this_machine(tmp_path: Path) -> None:
    """A real process with MaxText's module on its command line, of a run that already ended."""
    ended = write_record(tmp_path / "ended", status="succeeded", final=True)
    live = write_record(tmp_path / "live", supervisor={"pid": os.getpid(), "host": os.uname().nodename})
    children = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "maxtext.trainers.pre_train.train"],
                                 stdin=subprocess.PIPE, env={**os.environ, "MXC_RUN_DIR": run}) for run in (ended, live)]
    try:
        check = preflight.check_stale_processes(str(tmp_path / "mine"), False, False, os.geteuid(), Path("/proc"))
    finally:
        for child in children:
            child.communicate(b"")
    assert not check.passed
    stale = dict(item.split(" ", 1) for item in check.detail.split(": ", 1)[1].split(", "))
    assert stale[str(children[0].pid)] == f"(its run ended (succeeded): {ended})"
    assert str(children[1].pid) not in stale  # its supervisor (this test) is alive


# ---- disk


def df_free_gb(path: Path) -> float:
    """What the former bash measured: ``df -Pk`` available KB / 1048576."""
    line = subprocess.run(["df", "-Pk", str(path)], capture_output=True, text=True, check=True).stdout.splitlines()[1]
    return int(line.split()[3]) / 1048576


def test_disk(tmp_path: Path) -> None:
    target = tmp_path / "output" / "ckpt"
    ok = preflight.check_disk(target, 0.5)
    assert ok.passed and target.is_dir()
    free, _, rest = ok.detail.partition(" GB free in ")
    assert rest == f"{target}, need 0.5"
    assert abs(float(free) - df_free_gb(target)) < 0.5  # the machine is shared: others write meanwhile
    short = preflight.check_disk(target, 1000000.0)
    assert not short.passed and short.detail.endswith(f"GB free in {target}, need 1000000.0")


def test_disk_where_the_directory_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    check = preflight.check_disk(blocker / "ckpt", 0.0)
    assert check.passed and f"GB free in {blocker / 'ckpt'}, need 0.0" in check.detail
    monkeypatch.setattr(os, "statvfs", lambda path: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    broken = preflight.check_disk(tmp_path, 1.0)
    assert not broken.passed and broken.detail == f"cannot read the free space of {tmp_path}: Input/output error"


# ---- network


def test_network(tmp_path: Path) -> None:
    for name, state in (("eth0", "up"), ("ib0", "down"), ("lo", "unknown")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "operstate").write_text(state + "\n")
    assert preflight.check_network("eth0", tmp_path).as_dict() == {"check": "network", "status": "pass",
                                                                   "detail": "interface eth0 (up)"}
    assert preflight.check_network("lo", tmp_path).passed
    assert preflight.check_network("ib0", tmp_path).detail == "interface ib0 (down)"
    assert not preflight.check_network("ib0", tmp_path).passed
    none = preflight.check_network(None, tmp_path, "ib")
    assert not none.passed and none.detail == "interface none matches NCCL_SOCKET_IFNAME=ib (missing)"
    assert preflight.check_network("../../etc", tmp_path).detail == "interface ../../etc (missing)"


# ---- all of them, and preflight.json


def test_run_checks_writes_what_mxc_reads(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20260101-000000-0000-00000000"
    net = tmp_path / "net"
    (net / "eth0").mkdir(parents=True)
    (net / "eth0" / "operstate").write_text("up\n")
    config = preflight.PreflightConfig(run_dir=str(run), disk_path=run / "output", min_free_gb=1000000.0, gpus=2,
                                       gpu_vendor="nvidia", stale_processes=True, exclusive=True)
    roots = preflight.Roots(proc=tmp_path / "proc", dev=tmp_path / "dev", sys_net=net, node_names=("node1",), uid=UID)
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_GPUS": "2,3", "NCCL_SOCKET_IFNAME": "eth"}
    result = preflight.run_checks(config, node="node1", rank=1, attempt=2, env=env, interface="eth0", roots=roots)
    assert [c.check for c in result.checks] == ["gpus", "stale_processes", "disk", "network"]
    assert not result.passed and result.failures() == [result.checks[2].check + ": " + result.checks[2].detail]
    result.write(run / "ranks" / "1" / "preflight.json")
    written = json.loads((run / "ranks" / "1" / "preflight.json").read_text())
    assert list(written) == ["node", "rank", "attempt", "checks", "passed"]
    assert written["node"] == "node1" and written["rank"] == 1 and written["attempt"] == 2 and written["passed"] is False
    assert [set(c) for c in written["checks"]] == [{"check", "status", "detail"}] * 4
    summary = preflight_summary(JobFiles.read(RunDir(run)))
    assert summary["1"]["failed"] == result.failures()
    assert [p.name for p in (run / "ranks" / "1").iterdir()] == ["preflight.json"]  # no temporary file left


def test_run_checks_only_what_is_asked(tmp_path: Path) -> None:
    config = preflight.PreflightConfig(run_dir=str(tmp_path), disk_path=tmp_path, min_free_gb=0.0, gpus=None,
                                       stale_processes=False, network=False)
    result = preflight.run_checks(config, node="n", rank=0, attempt=0, env={}, interface=None)
    assert [c.check for c in result.checks] == ["disk"] and result.passed


def test_a_broken_check_fails_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> preflight.CheckResult:
        raise RuntimeError("unexpected /proc layout")

    monkeypatch.setattr(preflight, "check_stale_processes", boom)
    config = preflight.PreflightConfig(run_dir=str(tmp_path), disk_path=tmp_path, min_free_gb=0.0, network=False)
    result = preflight.run_checks(config, node="n", rank=0, attempt=0, env={}, interface=None)
    assert result.failures() == ["stale_processes: could not check: RuntimeError: unexpected /proc layout"]
