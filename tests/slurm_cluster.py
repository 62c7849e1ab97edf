"""A throw-away Slurm cluster for tests: a private munged, one slurmctld and N slurmd.

Everything lives in one temporary directory (config, state, spool, logs, pid files, the munge key
and socket), so nothing in /etc or /run is touched and several clusters can run side by side on
one machine (other engineers' tests run their own at the same time): every port is picked free at
start, never fixed. With more than one node, Debian's slurmd (built with MULTIPLE_SLURMD) emulates
nodes ``node1..nodeN`` on this machine; all of them have ``NodeAddr=127.0.0.1``. Fake GPUs are
gres/gpu entries whose ``File=`` are symlinks to /dev/null (Slurm insists on a device file).

Stopping ends only what this cluster started, by the pids its daemons wrote, after checking each
pid still runs the program we started (pid reuse); nothing is killed by name.

Follows the tested recipe in shared/docs/recipes/start-slurm.sh, in Python.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged")
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
})


class ClusterError(RuntimeError):
    """The cluster did not come up; the message carries the daemons' last log lines."""


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on right now (bound together so they differ; the kernel picks them)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    """Exists and is not a zombie (kill -0 says yes to zombies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stop_pids(pids: Sequence[int], comm: str, grace: float = 10.0) -> None:
    """TERM the pids that still run ``comm``, then KILL what is left after ``grace`` seconds."""
    ours = [p for p in pids if _alive(p) and _comm(p) == comm]
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        ours = [p for p in ours if _alive(p)]
        if not ours:
            return
        time.sleep(0.1)
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class SlurmCluster:
    """A running cluster. ``env`` is what a client needs (SLURM_CONF); ``run`` runs a client."""

    root: Path
    nodes: list[str]
    partition: str
    gpus_per_node: int
    cpus_per_node: int
    ctld_port: int
    slurmd_ports: list[int]
    pids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.env, **(extra or {})}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sbatch, squeue, scontrol, ...) against this cluster."""
        proc = subprocess.run(list(argv), env=self.environ(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, ExitCode, Restarts, NodeList, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields: dict[str, str] = {}
        for token in out.split():
            key, sep, value = token.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def wait_state(self, job_id: str, states: Sequence[str] | None = None, timeout: float = 120) -> str:
        """Wait until the job is in one of ``states`` (default: any terminal state); return it."""
        wanted = frozenset(states or TERMINAL_STATES)
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "?")
            if state in wanted:
                return state
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} still {state} after {timeout}s (wanted {sorted(wanted)})")

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self, remove: bool = True) -> None:
        """Cancel every job, then end our daemons by pid; remove the directory unless asked not to."""
        for pidfile in (self.root / "run").glob("*.pid"):  # also daemons that died before we read their pid
            name = "slurmd" if pidfile.name.startswith("slurmd-") else pidfile.stem
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                if pid not in self.pids.setdefault(name, []):
                    self.pids[name].append(pid)
        ctld = self.pids.get("slurmctld", [])
        if any(_alive(p) and _comm(p) == "slurmctld" for p in ctld):
            jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    if not self.run("squeue", "-h", "-t", "R,CG,S", "-o", "%A", check=False).stdout.strip():
                        break
                    time.sleep(0.25)
        _stop_pids(self.pids.get("slurmd", []), "slurmd")
        # A step that outlived scancel (slurmd died first): end its processes, then the stepd.
        stepds = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _comm(int(entry.name)) == "slurmstepd":
                with contextlib.suppress(OSError):
                    if any(str(self.root) in os.readlink(fd) for fd in (entry / "fd").iterdir()):
                        stepds.append(int(entry.name))
        for stepd in stepds:
            for pid in _descendants(stepd):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _stop_pids(stepds, "slurmstepd", grace=5)
        _stop_pids(ctld, "slurmctld")
        _stop_pids(self.pids.get("munged", []), "munged")
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)


def _wait_file(path: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip()
            if text:
                return int(text)
        time.sleep(0.05)
    raise ClusterError(f"no pid file {path}")


def _slurm_conf(root: Path, host: str, nodes: list[str], partition: str, cpus: int, mem_mb: int,
                gpus: int, ctld_port: int, slurmd_ports: list[int], cred_expire: int) -> str:
    lines = [
        "ClusterName=mxctest",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket,cred_expire={cred_expire}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmdParameters=config_overrides",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1,bf_interval=1",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root}/log/jobcomp.txt",
        "JobAcctGatherType=jobacct_gather/none",
        # gres/gpu in AccountingStorageTRES would make slurmctld fatal without slurmdbd.
        "AccountingStorageType=accounting_storage/none",
        "InactiveLimit=0",
        "MinJobAge=600",
        "KillWait=5",
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    for name, port in zip(nodes, slurmd_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} Sockets=1 "
            f"CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory={mem_mb}{gres} State=UNKNOWN"
        )
    lines.append(f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start_once(root: Path, nodes: int, gpus: int, partition: str, cpus: int, mem_mb: int,
                cred_expire: int, timeout: float) -> SlurmCluster:
    for sub in ("etc", "state", "log", "run", "munge", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    (root / "munge").chmod(0o755)  # munged insists the socket directory is world-executable
    host = socket.gethostname().split(".")[0]
    names = [host] if nodes == 1 else [f"node{i}" for i in range(1, nodes + 1)]
    for name in names:
        (root / "spool" / name).mkdir(parents=True, exist_ok=True)  # slurmd does not create it
    ports = free_ports(nodes + 1)
    cluster = SlurmCluster(root=root, nodes=names, partition=partition, gpus_per_node=gpus, cpus_per_node=cpus,
                           ctld_port=ports[0], slurmd_ports=ports[1:])

    try:
        return _bring_up(cluster, host, mem_mb, cred_expire, timeout)
    except BaseException:
        cluster.stop(remove=False)  # whatever came up before the failure
        raise


def _bring_up(cluster: SlurmCluster, host: str, mem_mb: int, cred_expire: int, timeout: float) -> SlurmCluster:
    root, names, gpus, nodes = cluster.root, cluster.nodes, cluster.gpus_per_node, len(cluster.nodes)

    def daemon(argv: list[str], out: str) -> None:
        with open(root / "log" / out, "ab") as fh:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, env=cluster.environ(),
                           check=True, timeout=30)

    key = root / "munge" / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--bits=1024"], check=True, capture_output=True)
    key.chmod(0o600)
    daemon(["munged", "--force", f"--socket={root}/munge/munge.socket", f"--key-file={key}",
            f"--pid-file={root}/run/munged.pid", f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge/munged.seed"], "munged.out")
    cluster.pids["munged"] = [_wait_file(root / "run" / "munged.pid")]

    cluster.conf.write_text(_slurm_conf(root, host, names, cluster.partition, cluster.cpus_per_node, mem_mb, gpus,
                                        cluster.ctld_port,
                                        cluster.slurmd_ports, cred_expire))
    if gpus:
        gres = ["AutoDetect=off"]
        for name in names:
            devdir = root / "dev" / name
            devdir.mkdir(parents=True, exist_ok=True)
            for g in range(gpus):
                (devdir / f"nvidia{g}").symlink_to("/dev/null")
            gres.append(f"NodeName={name} Name=gpu File={devdir}/nvidia[0-{gpus - 1}]")
        (root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
    (root / "env.sh").write_text(f"export SLURM_CONF={cluster.conf}\n")

    daemon(["slurmctld", "-i"], "slurmctld.out")
    cluster.pids["slurmctld"] = [_wait_file(root / "run" / "slurmctld.pid")]
    for name in names:
        daemon(["slurmd", "-N", name], f"slurmd-{name}.out")
    cluster.pids["slurmd"] = [_wait_file(root / "run" / f"slurmd-{name}.pid") for name in names]
    (root / "run" / "all.pids").write_text(" ".join(str(p) for ps in cluster.pids.values() for p in ps) + "\n")

    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        out = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=10)
        states = out.stdout.split()
        if states.count("idle") == nodes:
            return cluster
        if not all(_alive(p) for ps in cluster.pids.values() for p in ps):
            break
        time.sleep(0.25)
    raise ClusterError(f"nodes not idle (states: {states or 'none'}):\n{cluster.log_tail()}")


def start_cluster(nodes: int = 2, gpus: int = 0, partition: str = "mxctest", cpus: int = 4, mem_mb: int = 8192,
                  cred_expire: int = 5, timeout: float = 60, root: Path | None = None,
                  attempts: int = 3) -> SlurmCluster:
    """Start a cluster in a fresh directory; retried with new ports if a daemon fails (a port race).

    ``cpus`` and ``mem_mb`` are what each node advertises (may exceed the machine; nothing enforces
    them with task/none). ``cred_expire`` is how long a requeued job waits before it may run again.
    """
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        raise ClusterError("slurmctld/munged are not installed (scripts/setup.sh installs them)")
    last: Exception | None = None
    for _ in range(attempts):
        where = root or Path(tempfile.mkdtemp(prefix="mxc-slurm-"))
        try:
            return _start_once(where, nodes, gpus, partition, cpus, mem_mb, cred_expire, timeout)
        except (ClusterError, subprocess.SubprocessError, OSError) as exc:
            last = exc
            shutil.rmtree(where, ignore_errors=True)
    raise ClusterError(f"could not start a Slurm cluster in {attempts} attempts: {last}")


@contextlib.contextmanager
def running_cluster(**kwargs: object) -> Iterator[SlurmCluster]:
    cluster = start_cluster(**kwargs)  # type: ignore[arg-type]
    try:
        yield cluster
    finally:
        cluster.stop(remove=not os.environ.get("MXC_KEEP_SLURM"))


def stop_dir(root: Path) -> None:
    """Stop a cluster left running in ``root`` (by its pid files; for manual use)."""
    pids: dict[str, list[int]] = {}
    for text in (root / "run" / "all.pids").read_text().split():
        comm = _comm(int(text))
        if comm in DAEMONS:
            pids.setdefault(comm, []).append(int(text))
    cluster = SlurmCluster(root=root, nodes=[], partition="", gpus_per_node=0, cpus_per_node=0, ctld_port=0,
                           slurmd_ports=[], pids=pids)
    cluster.stop(remove=False)


if __name__ == "__main__":  # manual use: python tests/slurm_cluster.py start [NODES [GPUS]] | stop DIR
    import sys

    if sys.argv[1:2] == ["start"]:
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
        g = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        c = start_cluster(nodes=n, gpus=g)
        print(f"export SLURM_CONF={c.conf}   # stop: python {sys.argv[0]} stop {c.root}")
    elif sys.argv[1:2] == ["stop"]:
        stop_dir(Path(sys.argv[2]))
    else:
        sys.exit("usage: slurm_cluster.py start [NODES [GPUS]] | stop DIR")
