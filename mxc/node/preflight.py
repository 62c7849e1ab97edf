"""Node checks before training: fail in seconds, with the reason, instead of minutes into a job.

Port of the former preflight.sh. Each check is a function of injected roots (``/proc``, ``/dev``,
``/sys/class/net``) and returns a :class:`CheckResult`; :func:`run_checks` runs those the spec
asks for and gives a :class:`PreflightResult`, written as ``ranks/<rank>/preflight.json`` in the
shape mxc/runtime/slurm/events.py and triage read::

    {"node": "node1", "rank": 0, "attempt": 0,
     "checks": [{"check": "disk", "status": "pass", "detail": "74.9 GB free in /x, need 10.0"}],
     "passed": true}

New against the bash: a stale training process is also one whose run's local supervisor is gone
(its record stays unfinished forever); a visibility variable that is set but empty
(``CUDA_VISIBLE_DEVICES=``) means no GPU; free space is measured on the nearest existing parent
when the checkpoint directory cannot be created yet; a check that itself breaks fails with the
reason instead of killing the stage.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from . import atomicfile, netif, sysread

PASS, FAIL = "pass", "fail"
# What a MaxText training process has on its command line (the current and the older module path).
TRAINER_MARKERS = ("maxtext.trainers.", "MaxText.train")
# The allocation Slurm or the user gave this task, first set one wins (as in the former bash).
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_STEP_GPUS",
                 "SLURM_JOB_GPUS")
# Set but empty, these hide every GPU from CUDA/HIP; Slurm's variables only list what it allocated.
VISIBILITY_VARIABLES = GPU_VARIABLES[:3]
RECORD_LIMIT = 16 << 20  # bytes of a run record read to see whether the run ended


@dataclass(frozen=True)
class CheckResult:
    check: str  # gpus, stale_processes, disk, network
    status: str  # pass or fail
    detail: str

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail}


def result(check: str, ok: bool, detail: str) -> CheckResult:
    return CheckResult(check, PASS if ok else FAIL, detail)


@dataclass(frozen=True)
class PreflightResult:
    node: str
    rank: int
    attempt: int
    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failures(self) -> list[str]:
        """``check: detail`` of each failed check (logged as ``preflight failed: ...``, read by triage)."""
        return [f"{c.check}: {c.detail}" for c in self.checks if not c.passed]

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "attempt": self.attempt,
                "checks": [c.as_dict() for c in self.checks], "passed": self.passed}

    def write(self, path: Path) -> None:
        atomicfile.write_json(path, self.as_dict())


# ---- GPUs


def count_gpu_devices(vendor: str, dev: Path) -> int:
    """GPU device files on the node: DRM render nodes for AMD, ``/dev/nvidiaN`` otherwise."""
    names = sysread.list_dir(dev / "dri") if vendor == "amd" else sysread.list_dir(dev)
    pattern = re.compile(r"renderD\d+$" if vendor == "amd" else r"nvidia\d+$")
    return sum(1 for name in names if pattern.match(name))


def check_gpus(expected: int, vendor: str, env: Mapping[str, str], dev: Path) -> CheckResult:
    """This task sees exactly ``expected`` GPUs: the allocation's variables, else the node's device files."""
    for name in GPU_VARIABLES:
        value = env.get(name)
        if value is None or (value == "" and name not in VISIBILITY_VARIABLES):
            continue
        if value in ("", "NoDevFiles"):  # set to hide every GPU, or Slurm's word for "no device files"
            return result("gpus", expected == 0, f"expected {expected} GPU(s), visible 0 ({name} is {value!r})")
        seen = len([item for item in value.split(",") if item.strip()])
        return result("gpus", seen == expected, f"expected {expected} GPU(s), visible {seen} ({value})")
    seen = count_gpu_devices(vendor, dev)
    return result("gpus", seen == expected, f"expected {expected} GPU(s), visible {seen} (no allocation variables)")


# ---- training processes left over by other runs


def _load_record(run_dir: str) -> dict[str, Any] | None:
    data = sysread.read_bytes(Path(run_dir) / "record.json", RECORD_LIMIT)
    if not data:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _same_dir(a: str, b: str) -> bool:
    return bool(a) and bool(b) and os.path.normpath(a) == os.path.normpath(b)


def stale_reason(their_run: str, *, exclusive: bool, in_slurm: bool, proc: Path, node_names: tuple[str, ...]) -> str | None:
    """Why a training process of another run (``their_run``, maybe empty) is a leftover, or None if it may be live."""
    if in_slurm and exclusive:
        return "this job holds the node exclusively"
    if not their_run:
        return None  # no run directory: it may belong to anything live; not ours to judge
    record = _load_record(their_run)
    if record is None:
        return None
    if record.get("final") is True:
        return f"its run ended ({record.get('status', 'final')}): {their_run}"
    supervisor = record.get("supervisor")
    if isinstance(supervisor, dict) and supervisor.get("host") in node_names:
        pid = supervisor.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and not sysread.process_alive(proc, pid):
            return f"its run's supervisor (pid {pid}) is gone: {their_run}"
    return None


def _this_node_names() -> tuple[str, ...]:
    return tuple({socket.gethostname(), os.uname().nodename})


def check_stale_processes(run_dir: str, exclusive: bool, in_slurm: bool, uid: int, proc: Path, *,
                          node_names: tuple[str, ...] | None = None, self_pid: int | None = None) -> CheckResult:
    """No training process of another run of this user is left on the node.

    On a node this Slurm job holds exclusively, every training process of another run is a
    leftover of an earlier job. Elsewhere (a shared node, or no scheduler) other runs may be live:
    only those whose run ended (``record.json`` final) or whose local supervisor is gone (on this
    node, by ``record.supervisor``) are leftovers. Other users' processes are not ours to judge.
    """
    names = node_names if node_names is not None else _this_node_names()
    me = self_pid if self_pid is not None else os.getpid()
    stale = []
    for pid in sysread.process_ids(proc):
        if pid == me:
            continue
        cmdline = sysread.process_cmdline(proc, pid)
        if not cmdline or not any(marker in cmdline for marker in TRAINER_MARKERS):
            continue
        if sysread.process_uid(proc, pid) != uid or not sysread.process_alive(proc, pid):
            continue
        env = sysread.process_environ(proc, pid)
        if env is None:
            continue  # exited meanwhile, or not readable
        their_run = env.get("MXC_RUN_DIR", "")
        if _same_dir(their_run, run_dir):
            continue
        why = stale_reason(their_run, exclusive=exclusive, in_slurm=in_slurm, proc=proc, node_names=names)
        if why:
            stale.append(f"{pid} ({why})")
    return result("stale_processes", not stale, "training processes of other runs: " + (", ".join(stale) or "none"))


# ---- disk


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not os.path.exists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def check_disk(path: Path, min_free_gb: float) -> CheckResult:
    """At least ``min_free_gb`` GiB free where checkpoints go (created if missing, as the stage would)."""
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True)
    try:
        st = os.statvfs(_nearest_existing(path))
    except OSError as exc:
        return result("disk", False, f"cannot read the free space of {path}: {exc.strerror or exc}")
    free_gb = st.f_bavail * st.f_frsize / float(1 << 30)
    return result("disk", free_gb >= min_free_gb, f"{free_gb:.1f} GB free in {path}, need {min_free_gb}")


# ---- network


def check_network(iface: str | None, sys_net: Path, nccl_spec: str | None = None) -> CheckResult:
    """The interface chosen for NCCL/RCCL and Gloo (:func:`netif.choose_interface`) exists here and is up."""
    state = netif.operstate(sys_net, iface) if iface else "missing"
    shown = iface or f"none matches NCCL_SOCKET_IFNAME={nccl_spec or ''}"
    return result("network", bool(iface) and state in netif.UP_STATES, f"interface {shown} ({state})")


# ---- all of them


@dataclass(frozen=True)
class PreflightConfig:
    """What the spec asks to check (the bundle's run description carries it)."""

    run_dir: str
    disk_path: Path  # where checkpoints go
    min_free_gb: float
    gpus: int | None = None  # GPUs this task must see; None: not checked (runtime.preflight.gpus off, a CPU spec)
    gpu_vendor: str = "nvidia"
    stale_processes: bool = True
    exclusive: bool = False  # resources.exclusive
    network: bool = True


@dataclass(frozen=True)
class Roots:
    """Where the kernel's views are: the real ones on a node, fake trees in tests."""

    proc: Path = Path("/proc")
    dev: Path = Path("/dev")
    sys_net: Path = Path("/sys/class/net")
    node_names: tuple[str, ...] | None = None  # this node's host names (record.supervisor.host); None: ask the OS
    uid: int | None = None  # None: this process's uid


def _guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    try:
        return check()
    except Exception as exc:  # a broken check must say so, not kill the stage with a traceback
        return result(name, False, f"could not check: {type(exc).__name__}: {exc}")


def run_checks(config: PreflightConfig, *, node: str, rank: int, attempt: int, env: Mapping[str, str],
               interface: str | None, roots: Roots | None = None) -> PreflightResult:
    """Every check ``config`` asks for, in the order of preflight.json: gpus, stale_processes, disk, network."""
    r = roots or Roots()
    uid = r.uid if r.uid is not None else os.getuid()
    checks = []
    if config.gpus is not None:
        expected = config.gpus
        checks.append(_guarded("gpus", lambda: check_gpus(expected, config.gpu_vendor, env, r.dev)))
    if config.stale_processes:
        checks.append(_guarded("stale_processes", lambda: check_stale_processes(
            config.run_dir, config.exclusive, bool(env.get("SLURM_JOB_ID")), uid, r.proc, node_names=r.node_names)))
    checks.append(_guarded("disk", lambda: check_disk(config.disk_path, config.min_free_gb)))
    if config.network:
        checks.append(_guarded("network", lambda: check_network(interface, r.sys_net, env.get("NCCL_SOCKET_IFNAME"))))
    return PreflightResult(node, rank, attempt, checks)
