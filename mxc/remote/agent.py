"""The login node's side of every ``--cluster`` call: ``mxc remote-agent`` (hidden), the same mxc.

The laptop never sends shell code, only this command with quoted words. It
* refuses a laptop of another mxc version (``--expect-version``; bundle, record and output formats
  are versioned with mxc, so a mismatch is one line and exit 2 before anything is done);
* sets the profile's ``MXC_HOME``/``MXC_RUNS_DIR``, expanding a leading ``~`` or ``$VAR`` here, in
  Python (``$SCRATCH/mxc-runs``), never through a shell, so the rest of a value stays literal;
* then ``probe`` (version, sbatch, whether the store holds a bundle intact), ``receive`` (a bundle's
  tar stream on stdin, verified, stored: mxc/remote/sync.py), ``submit`` (``mxc run --cluster`` in one
  call: the bundle asked for only when the store lacks it, stored, then run), ``report`` (the report made here and
  sent back as a tar of the file and its JSON summary), or ``run`` (an ordinary mxc command, one of
  ``FORWARDED``, run in this process: sbatch, records, alerts are this mxc's as always).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any

from mxc import __version__
from mxc.errors import UserError

# The commands a laptop may run here through the agent (docs/remote.md); run is sent as the full hash.
FORWARDED = ("run", "runs", "logs", "wait", "cancel", "triage", "metrics", "watch")
_LEADING_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
REPORT_SUMMARY = "report.json"


def register(sub: Any) -> None:
    p = sub.add_parser("remote-agent", description="The login node's side of `mxc ... --cluster NAME` (docs/remote.md); "
                       "not for direct use.")
    p.set_defaults(handler=_agent)
    p.add_argument("--expect-version", metavar="VERSION", help="refuse unless this mxc is that version")
    p.add_argument("--home", help="MXC_HOME here (a leading ~ or $VAR is expanded here)")
    p.add_argument("--runs-dir", help="MXC_RUNS_DIR here (a leading ~ or $VAR is expanded here)")
    actions = p.add_subparsers(dest="action", required=True)
    probe = actions.add_parser("probe")
    probe.add_argument("--bundle", help="whether the store holds this bundle intact")
    receive = actions.add_parser("receive")
    receive.add_argument("bundle", help="the hash the bundle on stdin must have")
    submit = actions.add_parser("submit")
    submit.add_argument("bundle", help="the bundle the command runs: asked for on stdout when the store lacks it")
    submit.add_argument("argv", nargs=argparse.REMAINDER)
    report = actions.add_parser("report")
    report.add_argument("--suffix", choices=(".html", ".png"), default=".html")
    report.add_argument("--no-tsdb", action="store_true")
    report.add_argument("refs", nargs="*")
    run = actions.add_parser("run")
    run.add_argument("argv", nargs=argparse.REMAINDER)


def expand(value: str, what: str) -> str:
    """A profile path as this machine means it: a leading ``~``/``~/`` or ``$VAR``/``${VAR}`` expanded,
    the rest literal; UserError when the variable is not set here or the result is not absolute."""
    if value.startswith("~"):
        value = os.path.expanduser(value)
    elif (m := _LEADING_VARIABLE.match(value)) is not None:
        name = m.group(1) or m.group(2)
        if not os.environ.get(name):
            raise UserError(f"{what} {value[:200]}: ${name} is not set on {socket.gethostname()}",
                            f"set it there, or give the path itself: mxc cluster add ... --{what.replace('_', '-')} /path")
        value = os.environ[name] + value[m.end():]
    if not os.path.isabs(value):
        raise UserError(f"{what} {value[:200]}: not an absolute path on {socket.gethostname()}")
    return value


def _agent(args: argparse.Namespace) -> int:
    if args.expect_version is not None and args.expect_version != __version__:
        raise UserError(f"mxc on {socket.gethostname()} is {__version__}, the mxc that called it is "
                        f"{args.expect_version}: refusing (bundles, records and outputs are versioned with mxc)",
                        f"install mxc {args.expect_version} there, or use mxc {__version__} here")
    if args.home is not None:
        os.environ["MXC_HOME"] = expand(args.home, "home")
    if args.runs_dir is not None:
        from mxc.runtime.runpaths import RUNS_DIR_VARIABLE

        os.environ[RUNS_DIR_VARIABLE] = expand(args.runs_dir, "runs_dir")
    if args.action == "probe":
        return _probe(args.bundle)
    if args.action == "receive":
        return _receive(args.bundle)
    if args.action == "report":
        return _report(args.refs, args.suffix, args.no_tsdb)
    if args.action == "submit":
        return _submit(args.bundle, args.argv)
    return _forward(args.argv)


def _probe(bundle: str | None) -> int:
    from mxc.cli.common import store
    from mxc.node import integrity
    from mxc.runtime.runpaths import runs_root

    st = store()
    found: dict[str, Any] | None = None
    if bundle is not None:
        if not integrity.valid_hash(bundle):
            raise UserError(f"'{bundle[:80]}' is not a bundle hash (64 hex digits)")
        path = st.bundles / bundle
        present = os.path.lexists(path)
        found = {"hash": bundle, "present": present, "intact": present and not integrity.check(path, bundle)}
    _answer({"version": __version__, "host": socket.gethostname(), "python": sys.version.split()[0],
             "executable": _executable(), "sbatch": shutil.which("sbatch"), "home": str(st.home),
             "runs": str(runs_root(st.home)), "bundle": found})
    return 0


def _executable() -> str:
    """How mxc runs here: its script, or this Python with ``-m mxc``."""
    script = sys.argv[0]
    return script if Path(script).name == "mxc" else f"{sys.executable} -m mxc"


def _receive(bundle: str) -> int:
    _answer({"bundle": bundle, **_store(sys.stdin.buffer, bundle)})
    return 0


def _store(stream: IO[bytes], bundle: str) -> dict[str, Any]:
    """The bundle sent on ``stream``, proven to be ``bundle`` (mxc/remote/sync.py), in this store, and
    the store's own integrity check of what is now on disk, before anything uses it."""
    from mxc.cli.common import store
    from mxc.remote.sync import unpack

    files = unpack(stream, bundle)
    st = store()
    stored, how = st.put(files, bundle)
    st.require_intact(stored)
    return {"state": how.state, "files": len(files), "path": str(stored.path)}


def _submit(bundle: str, argv: list[str]) -> int:
    """``mxc run --cluster`` in one call (one start of this mxc, one round trip): say whether the store
    holds the bundle intact; if not, take it from stdin (``sync.frame``), verify and store it; then run."""
    from mxc.cli.common import store
    from mxc.node import integrity
    from mxc.remote.sync import MARK, read_frame

    if not integrity.valid_hash(bundle):
        raise UserError(f"'{bundle[:80]}' is not a bundle hash (64 hex digits)")
    if argv[:2] != ["run", bundle]:
        raise UserError(f"remote-agent submit {bundle[:12]}: the command must be run {bundle[:12]}..., "
                        f"not {' '.join(argv[:2])[:80] or 'nothing'}")
    path = store().bundles / bundle
    if os.path.lexists(path) and not integrity.check(path, bundle):
        _say(f"{MARK} {bundle} present")
    else:
        _say(f"{MARK} {bundle} wanted")
        _store(read_frame(0), bundle)
        _say(f"{MARK} {bundle} stored")
    return _forward(argv)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _report(refs: list[str], suffix: str, no_tsdb: bool) -> int:
    """The report made here (the run's TSDB and logs are here), sent back with its JSON summary as a tar."""
    from mxc.cli.main import main

    with tempfile.TemporaryDirectory(prefix="mxc-report-") as tmp:
        output = Path(tmp) / f"report{suffix}"
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            code = main(["report", *refs, "-o", str(output), "--json", *(["--no-tsdb"] if no_tsdb else [])])
        if code != 0:
            return code
        out = sys.stdout.buffer
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tar.add(output, arcname=output.name, recursive=False)
            summary = captured.getvalue().encode()
            info = tarfile.TarInfo(REPORT_SUMMARY)
            info.size = len(summary)
            tar.addfile(info, io.BytesIO(summary))
        out.flush()
    return 0


def _forward(argv: list[str]) -> int:
    from mxc.cli.main import main

    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] not in FORWARDED:
        raise UserError(f"remote-agent run: {' '.join(argv[:1]) or 'nothing'} is not a command run for a laptop",
                        "one of: " + ", ".join(FORWARDED))
    _end_with_the_laptop()
    return main(argv)


def _end_with_the_laptop() -> None:
    """Interrupt this command when the laptop's ssh goes (Ctrl-C on ``logs -f``, a closed lid): the
    laptop holds our stdin open for as long as it waits, so its end arrives here as end of file. Without
    a terminal nothing else would tell a command that never writes (``wait``, a quiet ``logs -f``) that
    nobody reads it, and it would stay on the login node until the run ends. Children get /dev/null."""
    import signal
    import threading

    watched = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def watch() -> None:
        with os.fdopen(watched, "rb", buffering=0) as laptop:
            while laptop.read(4096):
                pass
        os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt: "mxc: interrupted", exit 130, as at a terminal

    threading.Thread(target=watch, name="laptop-watch", daemon=True).start()


def _answer(data: dict[str, Any]) -> None:
    """One JSON line, the last of stdout (a login shell's start-up files may have printed before it)."""
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()
