"""The --probe worker: jaxlib and MaxText judge a whole matrix in one process start.

Run as a plain script by the training interpreter (it imports nothing from mxc, so any venv
with jax and maxtext can run it): reads one JSON request on stdin, writes one JSON answer on
stdout. Request: ``{"tokens": ["--xla_a=1", ...], "maxtext": [{"id": "..", "config": "base.yml",
"argv": ["k=v", ...], "devices": 16}], "workers": 2, "outdir": "/tmp/..."}``.

Why forks: jaxlib parses XLA_FLAGS once per process and *aborts* on an unknown flag, and
MaxText's pyconfig asks jax how many devices exist. So the parent imports jax and pyconfig
once (the slow part, ~3 s) without starting a backend, and each question is answered by a
forked child that sets its environment, starts the CPU backend and exits:

- XLA flags: every distinct token of the matrix goes into one child's XLA_FLAGS. jaxlib names
  what it rejects (unknown flags all at once; bad values one log line each); those are removed
  and the rest re-run until it starts cleanly. Tokens jaxlib does not name are found by
  bisection. A clean matrix costs one child.
- MaxText: children per device count (``--xla_force_host_platform_device_count`` fakes the
  job's nodes x GPUs as CPU devices), each validating its share of the distinct override sets
  with ``pyconfig._initialize_pydantic``, in parallel up to ``workers``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import time
from typing import Any

CHILD_TIMEOUT = 300.0
_COULD_NOT = re.compile(r"Couldn't interpret value (.*) for flag ([A-Za-z0-9_]+)\.")
_ILLEGAL = re.compile(r"(?:Illegal|Invalid|Unknown) value for --?([A-Za-z0-9_]+)")
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")


def _fork(target: Any, env: dict[str, str], outdir: str) -> tuple[int, str]:
    """Run ``target()`` in a forked child with ``env`` set; its stderr goes to a file. -> (pid, path)."""
    fd, path = tempfile.mkstemp(prefix="probe-", suffix=".log", dir=outdir)
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.dup2(fd, 2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.environ.update(env)
            target()
            code = 0
        except BaseException as exc:
            os.write(2, f"\nPROBE-EXCEPTION: {type(exc).__name__}: {exc}\n".encode())
            code = 3
        os._exit(code)
    os.close(fd)
    return pid, path


def _wait(pids: dict[int, Any], timeout: float = CHILD_TIMEOUT) -> dict[int, int]:
    """Wait for all children; kill the ones past ``timeout``. -> pid: exit status (negative = signal)."""
    deadline = time.monotonic() + timeout
    status: dict[int, int] = {}
    while len(status) < len(pids):
        for pid in pids:
            if pid in status:
                continue
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status[pid] = os.waitstatus_to_exitcode(raw)
        if len(status) < len(pids):
            if time.monotonic() > deadline:
                for pid in pids:
                    if pid not in status:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        status[pid] = -signal.SIGKILL
            time.sleep(0.02)
    return status


def _start_backend() -> None:
    import jax

    jax.devices()


def _try_tokens(tokens: list[str], outdir: str) -> tuple[bool, str]:
    env = {"XLA_FLAGS": " ".join(tokens), "JAX_PLATFORMS": "cpu"}
    pid, path = _fork(_start_backend, env, outdir)
    code = _wait({pid: None})[pid]
    with open(path, encoding="utf-8", errors="replace") as fh:
        log = fh.read()
    os.unlink(path)
    return code == 0, log


def _message(log: str) -> str:
    errors = [line for line in log.splitlines() if line[:1] == "E" and re.match(r"^E\d{4} ", line)]
    text = " ".join(re.sub(r"^E\d{4} [\d:.]+\s+\d+ \S+\] ", "", line) for line in errors)[:600]
    return f"jaxlib: {text}" if text else "jaxlib: its flag parser rejected this value (without naming it)"


def bad_tokens(tokens: list[str], outdir: str) -> dict[str, str]:
    """token -> jaxlib's complaint, for every token jaxlib rejects."""
    bad: dict[str, str] = {}
    pending = list(dict.fromkeys(tokens))
    while pending:
        ok, log = _try_tokens(pending, outdir)
        if ok:
            break
        named = _attribute(pending, log)
        if not named:
            if len(pending) == 1:
                bad[pending[0]] = _message(log)
                break
            half = len(pending) // 2
            for part in (pending[:half], pending[half:]):
                bad.update(bad_tokens(part, outdir))
            break
        for tok, why in named.items():
            bad[tok] = why
        pending = [t for t in pending if t not in named]
    return bad


def _attribute(tokens: list[str], log: str) -> dict[str, str]:
    """Tokens the log names: unknown flags by their text, bad values by flag name (only when one
    token carries that flag, else they are tested one by one)."""
    out: dict[str, str] = {}
    unknown = _UNKNOWN.search(log)
    if unknown:
        listed = unknown.group(1).split()
        for tok in tokens:
            if tok in listed or tok.split("=", 1)[0] in listed:
                out[tok] = "jaxlib: unknown flag (XLA aborts at start-up)"
        return out
    by_flag: dict[str, list[str]] = {}
    for tok in tokens:
        by_flag.setdefault(tok.lstrip("-").split("=", 1)[0], []).append(tok)
    for line in log.splitlines():
        m = _COULD_NOT.search(line) or _ILLEGAL.search(line)
        if not m:
            continue
        name = m.group(2) if m.re is _COULD_NOT else m.group(1)
        candidates = by_flag.get(name, [])
        why = "jaxlib: " + re.sub(r"^[EF]\d{4} [\d:.]+\s+\d+ \S+\] ", "", line).strip()
        if len(candidates) == 1:
            out[candidates[0]] = why
        elif m.re is _COULD_NOT:
            exact = [t for t in candidates if t.split("=", 1)[-1].strip("\"'") == m.group(1)]
            for tok in exact[:1]:
                out[tok] = why
    return out


def _validate_chunk(cases: list[dict[str, Any]], base_dir: str, result_path: str, outdir: str) -> None:
    from maxtext.configs import pyconfig  # type: ignore[import-untyped]

    results: dict[str, str | None] = {}
    for case in cases:
        argv = ["probe", os.path.join(base_dir, case["config"]), "run_name=probe",
                f"base_output_directory={outdir}/out", "skip_jax_distributed_system=true", "jax_cache_dir=",
                *case["argv"]]
        try:
            pyconfig._initialize_pydantic(argv)
            results[case["id"]] = None
        except Exception as exc:
            results[case["id"]] = f"{type(exc).__name__}: {exc}"[:3000]
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump(results, fh)


def validate_overrides(cases: list[dict[str, Any]], workers: int, outdir: str) -> dict[str, str | None]:
    """case id -> None (MaxText accepts it) or MaxText's error text."""
    import maxtext  # type: ignore[import-untyped]

    base_dir = os.path.join(os.path.dirname(maxtext.__file__), "configs")
    by_devices: dict[int, list[dict[str, Any]]] = {}
    for case in cases:
        by_devices.setdefault(int(case["devices"]), []).append(case)
    jobs: list[tuple[int, list[dict[str, Any]]]] = []
    for devices, group in sorted(by_devices.items()):
        share = max(1, -(-len(group) // max(1, workers)))
        jobs += [(devices, group[i:i + share]) for i in range(0, len(group), share)]
    results: dict[str, str | None] = {}
    running: dict[int, tuple[str, str, list[dict[str, Any]], float]] = {}
    while jobs or running:
        while jobs and len(running) < max(1, workers):
            devices, chunk = jobs.pop(0)
            fd, result_path = tempfile.mkstemp(prefix="probe-mt-", suffix=".json", dir=outdir)
            os.close(fd)
            os.unlink(result_path)
            env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
            pid, log = _fork(lambda c=chunk, r=result_path: _validate_chunk(c, base_dir, r, outdir), env, outdir)
            running[pid] = (result_path, log, chunk, time.monotonic())
        finished: list[tuple[int, int]] = []
        for pid, (_, _, _, started) in running.items():
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                finished.append((pid, os.waitstatus_to_exitcode(raw)))
            elif time.monotonic() - started > CHILD_TIMEOUT:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                finished.append((pid, -signal.SIGKILL))
        if not finished:
            time.sleep(0.02)
        for pid, code in finished:
            result_path, log, chunk, _ = running.pop(pid)
            if os.path.exists(result_path):
                with open(result_path, encoding="utf-8") as fh:
                    results.update(json.load(fh))
            else:
                with open(log, encoding="utf-8", errors="replace") as fh:
                    tail = fh.read()[-1500:]
                for case in chunk:
                    results[case["id"]] = f"the MaxText probe process failed (exit {code}): {tail}"
    return results


def main() -> None:
    request = json.load(sys.stdin)
    outdir = request["outdir"]
    t0 = time.monotonic()
    import jax
    import jaxlib

    answer: dict[str, Any] = {"jaxlib": getattr(jaxlib, "__version__", "?"), "jax": jax.__version__,
                              "bad_tokens": {}, "maxtext": {}, "maxtext_version": None}
    if request.get("tokens"):
        answer["bad_tokens"] = bad_tokens(list(request["tokens"]), outdir)
    answer["xla_seconds"] = round(time.monotonic() - t0, 3)
    if request.get("maxtext"):
        try:
            from maxtext.configs import pyconfig  # noqa: F401 - once, before the forks
            from maxtext.version import __version__ as mt_version  # type: ignore[import-untyped]
        except ImportError as exc:
            answer["maxtext_error"] = f"maxtext is not importable here: {exc}"
        else:
            answer["maxtext_version"] = mt_version
            answer["maxtext"] = validate_overrides(list(request["maxtext"]), int(request.get("workers", 1)), outdir)
    answer["seconds"] = round(time.monotonic() - t0, 3)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
