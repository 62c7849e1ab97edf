"""mxc/node/postmortem.py: core limits, kernel lines, cgroup OOM counts and core search over fake
/proc trees, and a real child that dies of SIGSEGV under a core limit."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mxc.node import postmortem
from mxc.runtime.triage import catalog, evidence
from mxc.runtime.triage.logs import Scanner
from tests.conftest import REPO

DMESG = textwrap.dedent("""\
    [    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)
    [  100.250000] python3[4711]: segfault at 0 ip 00007f2a sp 00007ffd error 4 in libc.so.6
    [ 5000.100000] NVRM: Xid (PCI:0000:3b:00): 79, pid=4711, name=python3, GPU has fallen off the bus.
    [ 5001.000000] eth0: renamed from veth1234
    [ 5002.500000] Memory cgroup out of memory: Killed process 4711 (python3) total-vm:81234567kB
    [ 5003.000000] oom_reaper: reaped process 4711 (python3), now anon-rss:0kB
    no timestamp: out of memory
    """)


def fake_proc(root: Path, *, uptime: str = "5000.00 9000.00", cgroup: str = "0::/slurm/job_42/step_0\n",
              core_pattern: str = "core", core_uses_pid: str = "0") -> Path:
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "uptime").write_text(uptime + "\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "sys" / "kernel" / "core_pattern").write_text(core_pattern + "\n")
    (proc / "sys" / "kernel" / "core_uses_pid").write_text(core_uses_pid + "\n")
    return proc


def oom_count(cgroup_root: Path, relative: str, name: str, count: int) -> None:
    path = cgroup_root / relative / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name == "memory.events":
        path.write_text(f"low 0\nhigh 0\nmax 12\noom 1\noom_kill {count}\noom_group_kill 0\n")
    else:
        path.write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n")


def make(tmp_path: Path, proc: Path, *, dmesg: str | None = DMESG, max_mb: int = 8, keep: int = 2,
         backtrace: bool = False, gdb: str | None = None, attempt: int = 0) -> postmortem.Postmortem:
    run = tmp_path / "run"
    return postmortem.Postmortem(run_dir=run, rank_dir=run / "ranks" / "0", rank=0, attempt=attempt, node="node1",
                                 max_mb=max_mb, keep=keep, backtrace=backtrace, cwd=tmp_path / "work", proc=proc,
                                 cgroup_root=tmp_path / "cgroup", dmesg=lambda: dmesg, gdb=gdb)


# ---- small pieces


@pytest.mark.parametrize(("rc", "sig"), [(-11, 11), (139, 11), (137, 9), (134, 6), (1, 0), (0, 0), (124, 0), (255, 0)])
def test_signal_of(rc: int, sig: int) -> None:
    assert postmortem.signal_of(rc) == sig


def test_kernel_lines_since_begin() -> None:
    assert postmortem.kernel_lines(DMESG, 5000.0) == [
        "[ 5000.100000] NVRM: Xid (PCI:0000:3b:00): 79, pid=4711, name=python3, GPU has fallen off the bus.",
        "[ 5002.500000] Memory cgroup out of memory: Killed process 4711 (python3) total-vm:81234567kB"]
    many = "".join(f"[ {6000 + i}.000000] traps: python3[1] general protection fault\n" for i in range(500))
    kept = postmortem.kernel_lines(many, 0.0)
    assert len(kept) == postmortem.KERNEL_LINES and kept[-1].startswith("[ 6499.000000]")


@pytest.mark.parametrize(("cgroup", "relative", "name"), [
    ("0::/slurm/job_42/step_0\n", "slurm/job_42/step_0", "memory.events"),
    ("0::/user.slice\n", "unified/user.slice", "memory.events"),  # hybrid: v2 mounted at unified/
    ("12:pids:/x\n4:memory:/process_api/abc\n1:name=systemd:/\n0::/\n", "memory/process_api/abc", "memory.oom_control"),
    ("5:cpu,memory:/job\n", "cpu,memory/job", "memory.oom_control"),
])
def test_cgroup_oom_kills(tmp_path: Path, cgroup: str, relative: str, name: str) -> None:
    proc = fake_proc(tmp_path, cgroup=cgroup)
    assert postmortem.cgroup_oom_kills(proc, tmp_path / "cgroup") is None
    oom_count(tmp_path / "cgroup", relative, name, 3)
    assert postmortem.cgroup_oom_kills(proc, tmp_path / "cgroup") == 3


def test_cgroup_oom_kills_on_this_machine() -> None:
    found = postmortem.cgroup_oom_kills(Path("/proc"), Path("/sys/fs/cgroup"))
    assert found is None or found >= 0
    if Path("/sys/fs/cgroup/memory").is_dir() or Path("/sys/fs/cgroup/memory.events").exists():
        assert found is not None  # this machine has a memory controller: the count must be read


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_limit_core_size() -> None:
    """In a child: the limit is the process's own (inherited by the training it starts)."""
    out = run_python("import resource; from mxc.node.postmortem import limit_core_size as l\n"
                     "r = resource.RLIMIT_CORE\n"
                     "resource.setrlimit(r, (0, resource.RLIM_INFINITY)); a = l(8); sa = resource.getrlimit(r)[0]\n"
                     "resource.setrlimit(r, (0, 4 << 20)); b = l(8); sb = resource.getrlimit(r)[0]\n"
                     "c = l(0); sc = resource.getrlimit(r)[0]\n"
                     "print(repr((a, sa, b, sb, c, sc)))")
    assert out == repr(("", 8 << 20, "core files are limited to 4 MB here (hard limit), runtime.cores.max_mb asks for 8",
                        4 << 20, "", 0))


# ---- collect


def test_nothing_for_a_successful_stage(tmp_path: Path) -> None:
    pm = make(tmp_path, fake_proc(tmp_path))
    pm.begin()
    assert pm.marker is not None and pm.marker.exists() and pm.uptime == 5000.0
    assert pm.collect(0, sys.executable) == []
    assert not pm.marker.exists() and not (tmp_path / "run" / "stacks").exists()


def test_kernel_log_and_oom_count_for_a_killed_training(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    oom_count(tmp_path / "cgroup", "slurm/job_42/step_0", "memory.events", 0)
    pm = make(tmp_path, proc)
    pm.begin()
    oom_count(tmp_path / "cgroup", "slurm/job_42/step_0", "memory.events", 1)
    [kernel] = pm.collect(137, sys.executable)  # SIGKILL: no crash note, no core
    assert kernel == tmp_path / "run" / "ranks" / "0" / "kernel.0.log"
    lines = kernel.read_text().splitlines()
    assert lines[0].startswith("[ 5000.100000] NVRM: Xid") and len(lines) == 3
    assert lines[-1] == "mxc: memory cgroup oom_kill count rose from 0 to 1 while training ran"
    assert not (tmp_path / "run" / "stacks").exists()


def test_dmesg_unreadable(tmp_path: Path) -> None:
    pm = make(tmp_path, fake_proc(tmp_path), dmesg=None)
    pm.begin()
    [kernel] = pm.collect(-9, None)
    assert kernel.read_text() == ("mxc: dmesg is not readable here (kernel.dmesg_restrict); "
                                  "an OOM kill cannot be confirmed from the kernel log\n")
    kernel.unlink()
    pm.begin()
    assert pm.collect(1, None) == []  # an application error: nothing to say, and no empty file
    assert not kernel.exists()


def crash_note(tmp_path: Path, attempt: int = 0) -> list[str]:
    return (tmp_path / "run" / "stacks" / f"crash.rank-0.attempt-{attempt}.txt").read_text().splitlines()


def plant_core(directory: Path, name: str, newer_than: Path | None, size: int = 4096) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    core = directory / name
    core.write_bytes(b"\x7fELF" + b"\0" * size)
    if newer_than is not None:
        t = os.stat(newer_than).st_mtime + 5
        os.utime(core, (t, t))
    return core


def test_crash_note_and_core_by_a_relative_pattern(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, core_pattern="core.%e.%p")
    pm = make(tmp_path, proc, dmesg="")
    pm.begin()
    assert pm.marker is not None
    old = plant_core(tmp_path / "work", "core.python3.100", None)
    os.utime(old, (1, 1))  # from before this attempt
    plant_core(tmp_path / "work", "core.python3.200", pm.marker)
    written = pm.collect(139, sys.executable)
    run = tmp_path / "run"
    assert written == [run / "stacks" / "crash.rank-0.attempt-0.txt", run / "cores" / "core.rank-0.attempt-0"]
    note = crash_note(tmp_path)
    limit_kb = postmortem._kb(resource.getrlimit(resource.RLIMIT_CORE)[0])
    assert note[:4] == ["signal: 11 (SEGV)", "node: node1", "rank: 0", "attempt: 0"]
    assert note[4] == f"address_space_limit_kb: {postmortem._kb(resource.getrlimit(resource.RLIMIT_AS)[0])}"
    assert note[5].startswith("core: cores/core.rank-0.attempt-0 (") and note[5].endswith(f" KB, limit {limit_kb} KB)")
    assert len(note) == 6 and old.exists() and not (tmp_path / "work" / "core.python3.200").exists()


def test_the_note_reads_as_triage_expects(tmp_path: Path) -> None:
    """mxc/runtime/triage/evidence.py parses the crash note: signal, core and backtrace lines."""
    pm = make(tmp_path, fake_proc(tmp_path, core_pattern=str(tmp_path / "cores-here" / "core")), dmesg="",
              backtrace=True, gdb=None)
    pm.begin()
    assert pm.marker is not None
    plant_core(tmp_path / "cores-here", "core", pm.marker)
    pm.collect(-6, sys.executable)
    facts = evidence.Facts()
    evidence.stack_files(tmp_path / "run", Scanner(catalog.load(), tmp_path / "run", 2026), facts)
    [crash] = facts.crashes
    assert (crash.rank, crash.attempt, crash.signal, crash.core) == (0, 0, "SIGABRT", "cores/core.rank-0.attempt-0")
    assert crash.note[-1] == "backtrace: not written (gdb is not installed, or training ran in a container)"


@pytest.mark.parametrize(("pattern", "uses_pid", "expected"), [
    ("|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h",
     "0", "core: handed to |/usr/lib/systemd/systemd-coredump by kernel.core_pattern "
          "(see coredumpctl or the handler's directory)"),
    ("/var/crash/%u/core.%p", "0", "core: not searched (core_pattern /var/crash/%u/core.%p)"),
    ("core", "1", "core: none found in {work} (core_pattern core, limit {limit} KB)"),
])
def test_core_patterns(tmp_path: Path, pattern: str, uses_pid: str, expected: str) -> None:
    pm = make(tmp_path, fake_proc(tmp_path, core_pattern=pattern, core_uses_pid=uses_pid), dmesg="")
    pm.begin()
    (tmp_path / "work").mkdir()
    decoy = tmp_path / "work" / "core-not-a-core"  # core_uses_pid: core.<pid>, not any core*
    decoy.write_text("")
    assert pm.marker is not None
    later = pm.marker.stat().st_mtime_ns + 10**9  # newer than the marker whatever the clock's granularity
    os.utime(decoy, ns=(later, later))
    pm.collect(139, None)
    limit = postmortem._kb(resource.getrlimit(resource.RLIMIT_CORE)[0])
    assert crash_note(tmp_path)[-1] == expected.format(work=tmp_path / "work", limit=limit)


def test_core_uses_pid(tmp_path: Path) -> None:
    pm = make(tmp_path, fake_proc(tmp_path, core_pattern="core", core_uses_pid="1"), dmesg="")
    pm.begin()
    assert pm.marker is not None
    plant_core(tmp_path / "work", "core.4711", pm.marker)
    assert tmp_path / "run" / "cores" / "core.rank-0.attempt-0" in pm.collect(-11, None)


def test_cores_kept_are_bounded_and_zero_means_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    for attempt in (0, 1):
        pm = make(tmp_path, proc, dmesg="", keep=1, attempt=attempt)
        pm.begin()
        assert pm.marker is not None
        plant_core(tmp_path / "work", "core", pm.marker)
        pm.collect(139, None)
    assert [p.name for p in (tmp_path / "run" / "cores").iterdir()] == ["core.rank-0.attempt-0"]
    assert crash_note(tmp_path, 1)[-1] == (f"core: left at {tmp_path / 'work' / 'core'} (1 cores kept already, "
                                           "runtime.cores.keep is 1)")
    pm = make(tmp_path, proc, dmesg="", max_mb=0, attempt=2)
    pm.begin()
    pm.collect(139, None)
    assert crash_note(tmp_path, 2)[-1] == ("core: none (runtime.cores.max_mb is 0); "
                                           "the Python stack is in the log (faulthandler)")


def test_collection_never_raises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pm = make(tmp_path, fake_proc(tmp_path))
    pm.begin()

    def broken() -> str:
        raise RuntimeError("dmesg exploded")

    pm.dmesg = broken
    assert pm.collect(139, None) == []
    assert "post-mortem evidence incomplete: RuntimeError: dmesg exploded" in capsys.readouterr().err
    assert pm.marker is not None and not pm.marker.exists()


# ---- a real crash


CRASHER = ("import os, signal\n"
           "hold = bytearray(40 << 20); hold[::4096] = b'x' * len(hold[::4096])\n"
           "os.kill(os.getpid(), signal.SIGSEGV)\n")


def test_a_real_segfault_keeps_a_bounded_core_and_its_backtrace(tmp_path: Path) -> None:
    """A child that holds 40 MB and dies of SIGSEGV under an 8 MB core limit, with this machine's
    own core_pattern, dmesg and gdb."""
    work = tmp_path / "work"
    work.mkdir()
    run = tmp_path / "run"
    pm = postmortem.Postmortem(run_dir=run, rank_dir=run / "ranks" / "0", rank=0, attempt=0, node=os.uname().nodename,
                               max_mb=8, keep=1, backtrace=True, cwd=work)
    before = resource.getrlimit(resource.RLIMIT_CORE)
    try:  # as the node program does: the limit is its own, and the training inherits it
        assert postmortem.limit_core_size(8) == "" or before[1] != resource.RLIM_INFINITY
        pm.begin()
        child = subprocess.run([sys.executable, "-c", CRASHER], cwd=work, capture_output=True, timeout=120)
        assert child.returncode == -signal.SIGSEGV
        written = pm.collect(child.returncode, sys.executable)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, before)
    note = crash_note(tmp_path)
    assert note[0] == "signal: 11 (SEGV)" and run / "stacks" / "crash.rank-0.attempt-0.txt" in written
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|"):  # this machine hands cores to a helper: the note must say so
        assert note[-1].startswith("core: handed to |")
        return
    core = run / "cores" / "core.rank-0.attempt-0"
    # st_blocks, not st_size: the kernel may leave a sparse hole past the limit (file size > bytes written)
    assert core in written and 0 < core.stat().st_blocks * 512 <= (8 << 20) + (64 << 10)
    assert note[5].startswith("core: cores/core.rank-0.attempt-0 (") and note[5].endswith(" KB, limit 8192 KB)")
    if shutil.which("gdb") is None:
        assert note[6] == "backtrace: not written (gdb is not installed, or training ran in a container)"
        return
    native = run / "stacks" / "native.rank-0.attempt-0.txt"
    assert note[6] == "backtrace: stacks/native.rank-0.attempt-0.txt (gdb)" and native in written
    frames = evidence.crashing_thread(native)
    assert frames[0] == "Program terminated with signal SIGSEGV, Segmentation fault."
