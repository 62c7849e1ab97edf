"""Host plugin's stall signals (PSI, OOM kills, D-state, dirty pages) and GPU driver errors from
the kernel log: parsers on files recorded on this machine and on public records, then live on
this machine's /proc and /dev/kmsg where they exist."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from mxc.plugins import host, kmsg, stalls
from mxc.plugins.api import PluginContext
from tests.plugin_samples import samples, value

FIXTURES = Path(__file__).parent / "fixtures"
PROC = FIXTURES / "procfs"


def test_psi_totals_are_seconds_per_scope() -> None:
    """Recorded on this machine (Linux 6.18, psi=1): cpu has a full line since 5.13, io both."""
    cpu = stalls.parse_psi((PROC / "pressure/cpu").read_text())
    assert cpu == {"some": 1775.649077, "full": 0.0}
    assert stalls.parse_psi((PROC / "pressure/io").read_text()) == {"some": 49.781768, "full": 24.639809}
    # kernels before 5.13 print no full line for cpu
    assert stalls.parse_psi("some avg10=0.10 avg60=2.00 avg300=3.85 total=15\n") == {"some": 15e-6}
    assert stalls.parse_psi("garbage\n\nsome total=x\n") == {}


def test_stall_reading_from_recorded_files() -> None:
    stat = (PROC / "stat").read_text()
    reading = stalls.read(PROC, stat, host.parse_meminfo((PROC / "meminfo").read_text()))
    assert (reading.procs_running, reading.procs_blocked, reading.context_switches) == (1, 0, 10442411)
    assert reading.dirty_bytes == 92 * 1024 and reading.writeback_bytes == 0
    assert reading.oom_kills == 0
    assert set(reading.pressure) == {"cpu", "io", "memory"}


def test_host_plugin_exports_the_stall_series(tmp_path: Path) -> None:
    plugin = host.HostPlugin(PluginContext(run_dir=tmp_path), proc=PROC, sys_block=PROC / "sys_block", kernel_log=None)
    found = samples(plugin)
    assert value(found, "mxc_host_pressure_stalled_seconds_total", resource="io", scope="full") == 24.639809
    assert value(found, "mxc_host_procs_blocked") == 0 and value(found, "mxc_host_procs_running") == 1
    assert value(found, "mxc_host_oom_kills_total") == 0
    assert value(found, "mxc_host_memory_dirty_bytes") == 92 * 1024
    assert value(found, "mxc_host_context_switches_total") == 10442411
    assert value(found, "mxc_host_kernel_log_readable") == 0  # no kernel log given: said, not silent
    assert value(found, "mxc_host_cpu_seconds_total", mode="user") == 3955.15  # the rest is unchanged


def test_a_kernel_without_psi_or_vmstat_loses_only_those_series(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    shutil.rmtree(proc / "pressure")
    (proc / "vmstat").unlink()
    (proc / "diskstats").write_text("not diskstats\n")
    plugin = host.HostPlugin(PluginContext(run_dir=None), proc=proc, sys_block=proc / "sys_block", kernel_log=None)
    found = samples(plugin)
    names = {name for name, _ in found}
    assert not any(n.startswith(("mxc_host_pressure", "mxc_host_oom")) for n in names)
    assert "mxc_host_procs_blocked" in names and "mxc_host_cpus" in names and "mxc_host_load1" in names
    (proc / "net/dev").unlink()  # a part that raises is left out, logged once; the others keep serving
    found = samples(plugin)
    assert not any(n.startswith("mxc_host_network") for n, _ in found)
    assert value(found, "mxc_host_cpus") == 2


# ---- kernel log


def test_kernel_log_counts_gpu_driver_errors_of_the_kernel_only(tmp_path: Path) -> None:
    """Public kernel log lines (NVIDIA Xid 79, an amdgpu ring timeout and failed reset) as
    /dev/kmsg records; info lines, continuation lines and a user-written fake Xid do not count."""
    log = kmsg.KernelLog(FIXTURES / "kmsg/gpu-errors.kmsg")
    counts = log.poll()
    assert counts.by_driver == {"nvidia": 1, "amdgpu": 6}
    assert counts.by_xid == {"79": 1}  # the second Xid 79 line was written by a user process
    assert counts.records == 15
    assert log.poll().records == 15  # nothing new: nothing read twice
    log.close()


def test_kernel_log_holds_back_a_torn_record_and_bounds_a_backlog(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"3,1,10,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE (0x1,0x2)\n3,2,11,-;NVRM: Xid (PCI:0000:3b")
    log = kmsg.KernelLog(path)
    assert log.poll().by_xid == {"48": 1}
    with open(path, "ab") as fh:
        fh.write(b":00): 94, pid=1, Contained ECC error\n")
    assert log.poll().by_xid == {"48": 1, "94": 1}
    with open(path, "ab") as fh:
        fh.write(b"".join(b"6,%d,12,-;line %d\n" % (i, i) for i in range(3, 30)))
    assert log.poll(max_records=10).records < 30  # a full ring buffer is read over several scrapes
    assert log.poll(max_records=100).records == 29
    log.close()


def test_live_kernel_log_reads_only_what_is_new() -> None:
    """The real /dev/kmsg of this machine: the backlog once, then exactly the record written after.
    A process can write an Xid-looking line; it gets the user facility and is not counted."""
    assert os.access("/dev/kmsg", os.R_OK | os.W_OK), "the tests run as root (scripts/test.sh): /dev/kmsg is theirs"
    seen: list[kmsg.Record] = []
    log = kmsg.KernelLog(listener=seen.append)
    log.poll(max_records=10**9)  # the backlog since boot
    backlog, errors = len(seen), dict(log.counts.by_driver)
    marker = uuid.uuid4().hex
    with open("/dev/kmsg", "w") as fh:
        fh.write(f"<3>mxc test {marker}: NVRM: Xid (PCI:0000:02:00): 79, not from the driver\n")
    log.poll()
    mine = [r for r in seen[backlog:] if marker in r.message]  # other tests may log too: only count ours
    assert len(mine) == 1 and mine[0].facility == 1 and mine[0].level == 3
    assert all(marker not in r.message for r in seen[:backlog])
    assert log.counts.by_driver == errors
    log.close()


def test_live_host_plugin_on_this_machine(tmp_path: Path) -> None:
    """TCP, PSI and vmstat are real here: the series exist and counters are plausible."""
    plugin = host.create(PluginContext(run_dir=tmp_path))
    found = samples(plugin)
    assert value(found, "mxc_host_oom_kills_total") >= 0
    assert value(found, "mxc_host_procs_running") >= 1  # this test is running
    if Path("/proc/pressure/io").exists():
        assert value(found, "mxc_host_pressure_stalled_seconds_total", resource="io", scope="some") >= 0
    assert value(found, "mxc_host_kernel_log_readable") == int(os.access("/dev/kmsg", os.R_OK))
