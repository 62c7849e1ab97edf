"""`mxc logs --rank/--grep/--tail/--since/--config` on a Slurm job's log (every rank's lines in one
file, labelled ``R: `` by srun) and on a live local run followed with ``-f``.

The Slurm log is the two-node run recorded on the test cluster (tests/fixtures/runs/two-node/);
the real local run's log is exercised in tests/test_run_local.py (its shared training).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import REPO, Home, Mxc

TWO_NODE = REPO / "tests/fixtures/runs/two-node"
[RUN] = [p.name for p in TWO_NODE.iterdir()]
LOG = TWO_NODE / RUN / "train.log"
CONFIG = re.compile(r"\] Config param ")
PIECE = re.compile(r"'(, \(\)\)|, \(')")  # a piece of a cut logical_axis_rules value
NOTICE = re.compile(r"^\d+: \[NO-OP\] ")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    root = tmp_path_factory.mktemp("logs") / "mxc"
    shutil.copytree(TWO_NODE / RUN, root / "runs" / RUN)
    return Home(root)


def raw_lines(rank: int | None = None) -> list[str]:
    lines = LOG.read_text().splitlines()
    return lines if rank is None else [line for line in lines if line.startswith(f"{rank}: ")]


def test_config_dump_is_folded_per_rank_and_shown_with_config(home: Home) -> None:
    out = home.cli("logs", RUN)
    assert out.returncode == 0, out.stderr
    shown = out.stdout.splitlines()
    assert not [line for line in shown if CONFIG.search(line)]
    folds = [line for line in shown if "config lines folded" in line]
    # one line per rank; the pieces srun cut from long values (logical_axis_rules) fold with their line
    config = {r: sum(1 for line in raw_lines(r) if CONFIG.search(line)) for r in (0, 1)}
    pieces = {r: sum(1 for line in raw_lines(r) if not CONFIG.search(line) and PIECE.search(line)) for r in (0, 1)}
    assert config[0] > 400 and config[1] > 400 and pieces == {0: 8, 1: 8}
    assert sorted(folds) == [f"{r}: [... {config[r] + pieces[r]} config lines folded; --config to show]" for r in (0, 1)]
    notices = [line for line in shown if "notices of optional modules" in line]
    # every other line is kept, in order
    assert [line for line in shown if line not in folds and line not in notices] == [
        line for line in raw_lines() if not CONFIG.search(line) and not PIECE.search(line) and not NOTICE.search(line)]
    full = home.cli("logs", RUN, "--config")
    assert [line for line in full.stdout.splitlines() if line not in notices] == [
        line for line in raw_lines() if not NOTICE.search(line)]
    assert home.cli("logs", RUN, "--all").stdout.splitlines() == raw_lines()


def test_maxtexts_no_op_notices_are_folded_and_do_not_match_grep(home: Home) -> None:
    """MaxText 0.2.5's six '[NO-OP] <module>: dependency missing; using stub. (ModuleNotFoundError)' lines
    per rank opened every log and matched `--grep Error`: one line per rank says they were folded."""
    assert sum(1 for line in raw_lines() if NOTICE.search(line)) == 12
    folded = "[... 6 MaxText notices of optional modules replaced by stubs ('[NO-OP] ... dependency missing; using stub') " \
             "folded; --all to show]"
    shown = home.cli("logs", RUN).stdout.splitlines()
    assert sorted(line for line in shown if "NO-OP" in line) == [f"0: {folded}", f"1: {folded}"]
    errors = home.cli("logs", RUN, "--grep", "Error").stdout.splitlines()
    assert not [line for line in errors if "ModuleNotFoundError" in line], errors
    every = home.cli("logs", RUN, "--all", "--grep", "ModuleNotFoundError").stdout.splitlines()
    assert len(every) == 10 and all("[NO-OP]" in line for line in every)  # ImportError: the other two


def test_rank_keeps_only_that_ranks_lines(home: Home) -> None:
    for rank in (0, 1):
        out = home.cli("logs", RUN, "--rank", str(rank), "--all")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == raw_lines(rank)
        folded = home.cli("logs", RUN, "--rank", str(rank)).stdout.splitlines()
        assert all(line.startswith(f"{rank}: ") for line in folded)
        assert sum("config lines folded" in line for line in folded) == 1
    wrong = home.cli("logs", RUN, "--rank", "2")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == f"mxc: error: run {RUN} has no rank 2 (its ranks: 0, 1)\n"


def test_grep_and_tail(home: Home) -> None:
    steps = home.cli("logs", RUN, "--rank", "1", "--grep", r"completed step: \d+,").stdout.splitlines()
    assert [int(re.search(r"step: (\d+)", s)[1]) for s in steps] == list(range(30))  # type: ignore[index]
    last = home.cli("logs", RUN, "--rank", "1", "--grep", r"completed step: \d+,", "--tail", "3")
    assert last.stdout.splitlines() == steps[-3:]
    whole = home.cli("logs", RUN).stdout.splitlines()
    assert home.cli("logs", RUN, "--tail", "7").stdout.splitlines() == whole[-7:]
    assert home.cli("logs", RUN, "--tail", "0").stdout == ""
    # the grep sees the config lines too: they are counted in the fold line, not printed
    grepped = home.cli("logs", RUN, "--rank", "0", "--grep", "Config param (steps|vocab_size):").stdout
    assert grepped == "0: [... 2 config lines folded; --config to show]\n"
    shown = home.cli("logs", RUN, "--rank", "0", "--grep", "Config param (steps|vocab_size):", "--config").stdout
    assert [line.rsplit("Config param ", 1)[1] for line in shown.splitlines()] == ["steps: 30", "vocab_size: 256"]


def test_since_filters_on_the_time_each_line_was_logged(home: Home) -> None:
    # absl times are local; the fixture's were logged on a UTC machine: say the zone explicitly
    env = {**home.env(), "TZ": "UTC"}

    def logs(*args: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "mxc", "logs", RUN, *args], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    late = logs("--rank", "0", "--since", "2026-11-24T01:47:45")
    first = late[0]
    assert re.match(r"0: I1124 01:47:45\.", first), first
    before = [line for line in raw_lines(0) if re.match(r"0: I1124 01:47:(4[0-4]|[0-3]\d)", line)]
    assert before and not set(before) & set(late)
    assert late[-1] == raw_lines(0)[-1]  # "[mxc node1 rank 0] training finished": no time, inherits the last
    assert logs("--since", "2026-11-24T01:47:45Z") == logs("--since", "2026-11-24T02:47:45+01:00")
    assert len(logs("--since", "2026-11-24T01:00")) == len(logs())


def test_since_a_duration_counts_back_from_now(mxc: Mxc, mxc_home: Path) -> None:
    now = datetime.now()  # absl logs local time
    run = local_run(mxc_home, final=True, started=now - timedelta(hours=4))
    stamp = "I{:%m%d %H:%M:%S}.000000 1 metric_logger.py:265]".format
    lines = [f"{stamp(now - timedelta(hours=3))} completed step: 0", f"{stamp(now - timedelta(hours=1))} completed step: 1",
             "a line without a time of its own", f"{stamp(now - timedelta(seconds=30))} completed step: 2"]
    (run / "train.log").write_text("".join(line + "\n" for line in lines))

    def since(value: str) -> list[str]:
        out = mxc("logs", run.name, "--since", value)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert since("2h") == since("1h30m") == lines[1:]  # the untimed line has the time of the line before it
    assert since("10m") == lines[3:]
    assert since("1d") == lines


def local_run(home: Path, final: bool, started: datetime) -> Path:
    """A local run's directory as its supervisor writes it (alive: this test process stands in for it)."""
    from mxc.runtime.processes.procfs import ProcessId

    run = home / "runs" / "20990101-000000-aaaa-2f09e67f"
    run.mkdir(parents=True)
    record = {"run_id": run.name, "bundle": "2f09e67f" + "0" * 56, "spec_name": "tiny", "backend": "local",
              "status": "succeeded" if final else "running", "final": final,
              "started": started.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
              "supervisor": {"host": os.uname().nodename, **ProcessId.this_process().as_record()}}
    (run / "record.json").write_text(json.dumps(record))
    return run


@pytest.mark.parametrize(("args", "message"), [
    (("--grep", "(unclosed"), "mxc: error: --grep: '(unclosed' is not a regular expression"),
    (("--since", "yesterday"), "mxc: error: --since: 'yesterday' is neither a duration nor an ISO time"),
    (("--since", "10x"), "mxc: error: --since: '10x' is neither a duration nor an ISO time"),
    (("--tail", "-1"), "mxc: error: --tail: -1 is not a number of lines"),
    (("--rank", "-1"), "mxc: error: --rank: -1 is not a rank"),
])
def test_bad_filters_are_one_line_errors(home: Home, args: tuple[str, ...], message: str) -> None:
    out = home.cli("logs", RUN, *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(message) and out.stderr.count("\n") == 1


def test_follow_applies_the_filters_to_lines_as_they_come(mxc: Mxc, mxc_home: Path) -> None:
    run = local_run(mxc_home, final=False, started=datetime(2099, 1, 1, tzinfo=UTC))
    record = json.loads((run / "record.json").read_text())
    log = run / "train.log"
    log.write_text("".join(f"I0101 00:00:0{i}.000000 1 metric_logger.py:265] completed step: {i}, loss: 5.0\n"
                           for i in range(3)))
    proc = subprocess.Popen([sys.executable, "-m", "mxc", "logs", run.name, "-f", "--tail", "1", "--grep", "step|Config"],
                            cwd=REPO, env={**os.environ, "MXC_HOME": str(mxc_home)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def next_line() -> str:
        try:
            return lines.get(timeout=120)  # a safety net: each line is written as soon as it is read
        except queue.Empty:
            proc.kill()
            pytest.fail(f"mxc logs -f printed nothing more: {proc.communicate()[1][-2000:]}")

    try:
        assert next_line() == "I0101 00:00:02.000000 1 metric_logger.py:265] completed step: 2, loss: 5.0\n"
        with log.open("a") as fh:  # a restart's config dump, then its first step
            fh.writelines(f"I0101 00:01:00.000000 1 pyconfig.py:591] Config param key{i}: {i}\n" for i in range(5))
            fh.write("I0101 00:01:01.000000 1 other.py:1] unrelated\n")
            fh.write("I0101 00:01:02.000000 1 metric_logger.py:265] completed step: 3, loss: 4.9\n")
        assert next_line() == "[... 5 config lines folded; --config to show]\n"
        assert next_line() == "I0101 00:01:02.000000 1 metric_logger.py:265] completed step: 3, loss: 4.9\n"
        (run / "record.json").write_text(json.dumps({**record, "status": "succeeded", "final": True,
                                                     "ended": "2099-01-01T00:02:00.000Z"}))
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lines.empty()
