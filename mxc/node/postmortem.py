"""Evidence for ``mxc triage`` when training dies (``runtime.cores`` in the spec).

Port of the former _postmortem.j2. Around the train stage:

- :func:`limit_core_size` bounds core files (RLIMIT_CORE, inherited by the training process);
- :meth:`Postmortem.begin` notes the moment (a marker file, the kernel's uptime) and the memory
  cgroup's OOM-kill count;
- :meth:`Postmortem.collect` runs after the stage: for a failed training it keeps the kernel's
  lines since ``begin`` about memory, segfaults and GPU/ECC errors (``ranks/<r>/kernel.<a>.log``),
  says when the cgroup's OOM-kill count rose, and for a fatal signal writes the crash note
  ``stacks/crash.rank-<r>.attempt-<a>.txt``, moves the core file (found through
  ``kernel.core_pattern``) to ``cores/core.rank-<r>.attempt-<a>`` within ``runtime.cores.keep``
  and writes gdb's backtrace of every thread to ``stacks/native.rank-<r>.attempt-<a>.txt``.

The crash note's lines (``key: value``) are what mxc/runtime/triage/evidence.py reads; keep them.
Everything is best effort: a failed collection never changes how the stage ended.

Fixed against the bash: a relative ``core_pattern`` with a directory part is searched in that
directory (the bash looked for a name with a slash and never found it); with several matching
cores the newest is taken, not the last by name; v1 cgroups that share a hierarchy with other
controllers (``4:cpu,memory:/x``) are read too.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping

from . import sysread

# Signals whose default action dumps core: QUIT ILL TRAP ABRT BUS FPE SEGV XCPU XFSZ SYS.
CRASH_SIGNALS = frozenset({3, 4, 5, 6, 7, 8, 11, 24, 25, 31})
# Kernel lines worth keeping (matched on the lowercased line).
KERNEL_WORDS = re.compile(r"out of memory|oom-kill|oom_kill|killed process|segfault|general protection|traps:"
                          r"|xid|nvrm|amdgpu|ecc error|uncorrectable|hardware error|mce:|edac")
KERNEL_TIME = re.compile(r"^\[ *(\d+\.\d+)\]")
KERNEL_LINES = 200  # the last lines kept
GDB_TIMEOUT = 300.0
DMESG_TIMEOUT = 60.0
FIND = "find"  # look for gdb on PATH


def faulthandler_env(env: Mapping[str, str]) -> dict[str, str]:
    """PYTHONFAULTHANDLER=1 unless set: a fatal signal then prints every thread's Python stack to the log."""
    return {"PYTHONFAULTHANDLER": env.get("PYTHONFAULTHANDLER") or "1"}


def _kb(limit: int) -> str:
    """An rlimit in KB as ``ulimit`` prints it (``unlimited`` for RLIM_INFINITY)."""
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit // 1024)


def limit_core_size(max_mb: int) -> str:
    """Set the soft core-file limit to ``max_mb`` MB, within the hard limit; a note when the hard limit is lower.

    The limit is this process's, inherited by the training it starts. ``max_mb`` 0 means no core.
    """
    wanted = max(0, max_mb) * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    note = ""
    if hard != resource.RLIM_INFINITY and hard < wanted:
        wanted = hard
        note = (f"core files are limited to {hard // (1024 * 1024)} MB here (hard limit), "
                f"runtime.cores.max_mb asks for {max_mb}")
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (wanted, hard))
    except (OSError, ValueError) as exc:
        note = f"could not limit core files to {max_mb} MB: {exc}"
    return note


def signal_of(rc: int) -> int:
    """The signal that ended the training: ``-N`` (killed, from Python) or ``128+N`` (from a shell); else 0."""
    if rc < 0:
        return -rc
    if 128 < rc < 160:
        return rc - 128
    return 0


def signal_label(sig: int) -> str:
    """``SEGV`` for 11, as ``kill -l 11`` prints it; ``?`` when unknown."""
    try:
        return signal.Signals(sig).name[3:]
    except ValueError:
        return "?"


def read_dmesg() -> str | None:
    """The kernel ring buffer (``dmesg``); None when it cannot be read (``kernel.dmesg_restrict``, no dmesg)."""
    try:
        done = subprocess.run(["dmesg"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              timeout=DMESG_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def kernel_lines(dmesg: str, since: float) -> list[str]:
    """Lines stamped at or after ``since`` (seconds of uptime) that mention memory, crashes or GPU/ECC errors."""
    out = []
    for line in dmesg.splitlines():
        match = KERNEL_TIME.match(line)
        if match and float(match.group(1)) >= since and KERNEL_WORDS.search(line.lower()):
            out.append(line)
    return out[-KERNEL_LINES:]


def cgroup_oom_kills(proc: Path, cgroup_root: Path) -> int | None:
    """The OOM-kill count of this process's memory cgroup: v2 ``memory.events``, v1 ``memory.oom_control``."""
    for line in (sysread.read_text(proc / "self" / "cgroup") or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            files = [cgroup_root / relative / "memory.events", cgroup_root / "unified" / relative / "memory.events"]
        elif "memory" in controllers.split(","):
            # mounted under its controllers' names (cpu,memory), usually with a "memory" link beside
            files = [cgroup_root / "memory" / relative / "memory.oom_control"]
            if controllers != "memory":
                files.append(cgroup_root / controllers / relative / "memory.oom_control")
        else:
            continue
        for file in files:
            for entry in (sysread.read_text(file) or "").splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value.strip())
    return None


class Postmortem:
    """Evidence of one rank's train stage in one attempt; :meth:`begin` before it, :meth:`collect` after."""

    def __init__(self, *, run_dir: Path, rank_dir: Path, rank: int, attempt: int, node: str, max_mb: int,
                 keep: int, backtrace: bool, cwd: Path, proc: Path = Path("/proc"),
                 cgroup_root: Path = Path("/sys/fs/cgroup"), dmesg: Callable[[], str | None] = read_dmesg,
                 gdb: str | None = FIND) -> None:
        self.run_dir = run_dir
        self.rank_dir = rank_dir
        self.rank = rank
        self.attempt = attempt
        self.node = node
        self.max_mb = max_mb  # runtime.cores.max_mb
        self.keep = keep  # runtime.cores.keep: cores kept per run
        self.backtrace = backtrace  # runtime.cores.backtrace
        self.cwd = cwd  # the training's working directory: where a relative core_pattern puts cores
        self.proc = proc
        self.cgroup_root = cgroup_root
        self.dmesg = dmesg
        self.gdb = shutil.which("gdb") if gdb == FIND else gdb  # None: no backtraces
        self.tag = f"rank-{rank}.attempt-{attempt}"
        self.marker: Path | None = None
        self.uptime = 0.0
        self.oom_before: int | None = None

    # ---- around the stage

    def begin(self) -> None:
        """Just before training starts: the marker (cores newer than it are this attempt's), uptime, OOM count."""
        marker = self.rank_dir / f".postmortem.{self.attempt}"
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True)
            marker.write_bytes(b"")
            self.marker = marker
        except OSError:
            self.marker = None
        uptime = (sysread.read_text(self.proc / "uptime", 256) or "0").split()
        try:
            self.uptime = float(uptime[0]) if uptime else 0.0
        except ValueError:
            self.uptime = 0.0
        self.oom_before = cgroup_oom_kills(self.proc, self.cgroup_root)

    def collect(self, rc: int, trainer_exe: str | None) -> list[Path]:
        """After the stage ended with ``rc``: the evidence of a failure (nothing for rc 0); the files written.

        ``trainer_exe`` is the training's interpreter for gdb (native runs); None in a container,
        where the host's gdb cannot read the image's binaries.
        """
        written: list[Path] = []
        try:
            if rc != 0:
                sig = signal_of(rc)
                written += self._kernel_log(sig)
                if sig in CRASH_SIGNALS:
                    written += self._crash(sig, trainer_exe)
        except Exception as exc:  # best effort: evidence never changes how the stage ended
            print(f"[mxc] post-mortem evidence incomplete: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            if self.marker is not None:
                with contextlib.suppress(OSError):
                    self.marker.unlink()
        return written

    # ---- kernel

    def _kernel_log(self, sig: int) -> list[Path]:
        lines = []
        text = self.dmesg()
        if text is not None:
            lines += kernel_lines(text, self.uptime)
        elif sig == signal.SIGKILL:
            lines.append("mxc: dmesg is not readable here (kernel.dmesg_restrict); "
                         "an OOM kill cannot be confirmed from the kernel log")
        after = cgroup_oom_kills(self.proc, self.cgroup_root)
        if self.oom_before is not None and after is not None and after > self.oom_before:
            lines.append(f"mxc: memory cgroup oom_kill count rose from {self.oom_before} to {after} while training ran")
        if not lines:
            return []
        path = self.rank_dir / f"kernel.{self.attempt}.log"
        try:
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        except OSError:
            return []
        return [path]

    # ---- crash note, core, native backtrace

    def _crash(self, sig: int, trainer_exe: str | None) -> list[Path]:
        stacks = self.run_dir / "stacks"
        try:
            stacks.mkdir(parents=True, exist_ok=True)
        except OSError:
            return []
        note = stacks / f"crash.{self.tag}.txt"
        lines = [f"signal: {sig} ({signal_label(sig)})", f"node: {self.node}", f"rank: {self.rank}",
                 f"attempt: {self.attempt}",
                 # Under an address-space limit a failed mmap often surfaces as SIGSEGV, not as an error.
                 f"address_space_limit_kb: {_kb(resource.getrlimit(resource.RLIMIT_AS)[0])}"]
        written = [note]
        core_lines, files = self._core(trainer_exe)
        lines += core_lines
        written += files
        note.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return written

    def _core(self, trainer_exe: str | None) -> tuple[list[str], list[Path]]:
        """(note lines, files written) about the core file of this attempt."""
        if self.max_mb <= 0:
            return ["core: none (runtime.cores.max_mb is 0); the Python stack is in the log (faulthandler)"], []
        pattern = sysread.read_text(self.proc / "sys" / "kernel" / "core_pattern", 4096) or "core"
        if pattern.startswith("|"):
            handler = pattern.split()[0]
            return [f"core: handed to {handler} by kernel.core_pattern (see coredumpctl or the handler's directory)"], []
        where = Path(pattern) if pattern.startswith("/") else self.cwd / pattern
        directory, glob = where.parent, re.sub(r"%.", "*", where.name)
        if sysread.read_int(self.proc / "sys" / "kernel" / "core_uses_pid") == 1 and "%p" not in pattern:
            glob += ".*"  # the kernel appends .<pid> (core(5)); core-other is not this core
        if "%" in str(directory) or self.marker is None:
            return [f"core: not searched (core_pattern {pattern})"], []
        limit = _kb(resource.getrlimit(resource.RLIMIT_CORE)[0])
        core = newest_file(directory, glob, newer_than=self.marker)
        if core is None:
            return [f"core: none found in {directory} (core_pattern {pattern}, limit {limit} KB)"], []
        cores = self.run_dir / "cores"
        kept = count_files(cores)
        if kept >= self.keep:
            return [f"core: left at {core} ({kept} cores kept already, runtime.cores.keep is {self.keep})"], []
        dest = cores / f"core.{self.tag}"
        try:
            cores.mkdir(parents=True, exist_ok=True)
            shutil.move(str(core), str(dest))
            size_kb = (os.stat(dest).st_blocks + 1) // 2  # what du -k prints: the space it takes
        except OSError:
            return [f"core: found at {core} but could not be moved to cores/"], []
        lines = [f"core: cores/core.{self.tag} ({size_kb} KB, limit {limit} KB)"]
        files = [dest]
        if self.backtrace:
            exe = shutil.which(trainer_exe) if trainer_exe else None
            if exe and self.gdb:
                native = self.run_dir / "stacks" / f"native.{self.tag}.txt"
                gdb_backtrace(self.gdb, exe, dest, native)
                lines.append(f"backtrace: stacks/native.{self.tag}.txt (gdb)")
                files.append(native)
            else:
                lines.append("backtrace: not written (gdb is not installed, or training ran in a container)")
        return lines, files


def newest_file(directory: Path, glob: str, *, newer_than: Path) -> Path | None:
    """The most recently modified regular file in ``directory`` named like ``glob`` and modified after ``newer_than``."""
    try:
        since = os.stat(newer_than).st_mtime_ns
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for name in sysread.list_dir(directory):
        if not fnmatch.fnmatchcase(name, glob):
            continue
        try:
            st = os.lstat(directory / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mtime_ns > since and (best is None or (st.st_mtime_ns, name) > best):
            best = (st.st_mtime_ns, name)
    return directory / best[1] if best else None


def count_files(directory: Path) -> int:
    count = 0
    for name in sysread.list_dir(directory):
        try:
            if stat.S_ISREG(os.lstat(directory / name).st_mode):
                count += 1
        except OSError:
            continue
    return count


def gdb_backtrace(gdb: str, exe: str, core: Path, out: Path) -> None:
    """Every thread's native backtrace (40 frames) of ``core`` into ``out``; bounded in time, at low priority."""
    argv = [gdb, "-batch", "-nx", "-q", "-ex", "set pagination off", "-ex", "info threads",
            "-ex", "thread apply all bt 40", exe, str(core)]
    nice = shutil.which("nice")
    if nice:
        argv = [nice, *argv]
    try:
        with open(out, "wb") as fh:
            subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=GDB_TIMEOUT,
                           check=False)
    except (OSError, subprocess.SubprocessError):
        pass
