"""Attacks on what mxc reads (issue [1/6]): run directories whose files are directories, FIFOs,
binary, deeply nested or misshapen JSON; an interpreter that prints a banner; a ``code.repo``
that git would read as an option or a program.

Readers must neither crash nor hang: every file goes through mxc/fsutil.py (regular files only,
opened non-blocking, bounded bytes, bounded JSON depth). A FIFO that made a reader wait would
hang the test: the ``timeout`` marks turn that into a failure.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mxc.errors import UserError
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.store import Store
from tests.conftest import REPO, Mxc, store_snapshot

TINY = str(REPO / "specs/tiny.yaml")
DEEP = "[" * 100_000 + "]" * 100_000


def _record(run_id: str, bundle: str, **fields: object) -> str:
    data = {"run_id": run_id, "bundle": bundle, "spec_name": "tiny", "backend": "local", "status": "failed",
            "final": True, "started": "2099-01-01T00:00:00.000Z", "ended": "2099-01-01T00:01:00.000Z",
            "exit_code": 1, **fields}
    return json.dumps(data)


def _replace_with_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _replace_with_dir(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir(parents=True)


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def _live(run: Path, fifo_log: bool) -> None:
    """The run's record says it is still running, under a supervisor that is this test's process."""
    (run / "record.json").write_text(_record(run.name, json.loads((run / "record.json").read_text())["bundle"],
                                             status="running", final=False, ended=None,
                                             supervisor={"pid": os.getpid(), "host": os.uname().nodename}))
    if fifo_log:
        _replace_with_fifo(run / "train.log")


def _bundle_of(run: Path) -> str:
    """The bundle the run's sane record names (a record naming another bundle than its id is unreadable)."""
    bundle: str = json.loads((run / "record.json").read_text())["bundle"]
    return bundle


def _rank(run: Path) -> Path:
    (run / "ranks" / "0").mkdir(parents=True, exist_ok=True)
    return run / "ranks" / "0"


# name -> what to do to an otherwise normal, finished run directory
HOSTILE: dict[str, Callable[[Path], object]] = {
    "record.json is a directory": lambda run: _replace_with_dir(run / "record.json"),
    "record.json is a FIFO": lambda run: _replace_with_fifo(run / "record.json"),
    "record.json is binary": lambda run: (run / "record.json").write_bytes(b"\x00\xff" * 100),
    "record.json is deep": lambda run: (run / "record.json").write_text('{"run_id": "x", "deep": ' + DEEP + "}"),
    "record.json has a lone surrogate": lambda run: (run / "record.json").write_text(
        _record(run.name, "0" * 64, spec_name="\ud800x")),
    "record.json has misshapen facts": lambda run: (run / "record.json").write_text(_record(
        run.name, _bundle_of(run), host={"cpu": 5, "python": []}, image={"container": [1]}, status="running", final=False,
        ended=None, supervisor={"pid": 10**30, "host": os.uname().nodename})),
    "train.log is a FIFO": lambda run: _replace_with_fifo(run / "train.log"),
    "a live run's train.log is a FIFO": lambda run: _live(run, fifo_log=True),
    "train.log is a directory": lambda run: _replace_with_dir(run / "train.log"),
    "train.log is binary": lambda run: (run / "train.log").write_bytes(bytes(range(256)) * 400),
    "metrics.jsonl is a FIFO": lambda run: _replace_with_fifo(run / "metrics.jsonl"),
    "metrics.jsonl is a directory": lambda run: _replace_with_dir(run / "metrics.jsonl"),
    "metrics.jsonl is deep": lambda run: (run / "metrics.jsonl").write_text(
        DEEP + "\n" + '{"step": 0, "learning/loss": 1.0}\n'),
    "metrics.jsonl is binary": lambda run: (run / "metrics.jsonl").write_bytes(os.urandom(4096) + b"\n\xff{}\n"),
    "metrics.jsonl is misshapen": lambda run: (run / "metrics.jsonl").write_text(
        '{"step": Infinity, "learning/loss": "x"}\n{"step": 1, "learning/loss": [1]}\n[1]\n"s"\n'
        + '{"step": ' + "9" * 5000 + "}\n"),
    "a metrics part is a FIFO": lambda run: _fifo(run / "metrics" / "attempt-0.rank-0.jsonl"),
    "events.jsonl is a FIFO": lambda run: os.mkfifo(_rank(run) / "events.jsonl"),
    "events.jsonl is misshapen": lambda run: (_rank(run) / "events.jsonl").write_text(
        '{"event": "exit", "attempt": "x", "rc": [1]}\n{"event": "exit", "attempt": 0, "rc": "1"}\n' + DEEP + "\n"),
    "preflight.json is deep": lambda run: (_rank(run) / "preflight.json").write_text(DEEP),
    "a rank's kernel log is a FIFO": lambda run: os.mkfifo(_rank(run) / "kernel.0.log"),
    "a crash note is a FIFO": lambda run: _fifo(run / "stacks" / "crash.rank-0.attempt-0.txt"),
    "the observability events are a FIFO": lambda run: _fifo(run / "observability" / "events.jsonl"),
}


@pytest.fixture
def hostile_home(mxc_home: Path) -> tuple[Path, str, dict[str, RunDir]]:
    """A store with the tiny bundle, and one finished run of it per hostile case (plus a sane one)."""
    from mxc.build import compile_file
    from mxc.store import Store

    bundle = compile_file(TINY)
    Store(mxc_home).put(bundle.files, bundle.hash)
    runs: dict[str, RunDir] = {}
    for number, name in enumerate(["sane", *HOSTILE]):
        run = RunDir(mxc_home / "runs" / f"20990101-0000{number:02d}-aaaa-{bundle.hash[:8]}")
        run.path.mkdir(parents=True)
        run.record.write_text(_record(run.run_id, bundle.hash))
        run.log.write_text("completed step: 0, seconds: 0.001, total_weights: 64, loss: 1.000\n")
        run.metrics.write_text('{"step": 0, "learning/loss": 1.0}\n')
        if name != "sane":
            HOSTILE[name](run.path)
        runs[name] = run
    return mxc_home, bundle.hash, runs


@pytest.mark.timeout(300)
def test_every_reader_survives_every_hostile_run_directory(hostile_home: tuple[Path, str, dict[str, RunDir]]) -> None:
    from mxc.report.data import gather
    from mxc.runtime import runs as runs_mod
    from mxc.runtime.logs.metrics_merge import write_merged
    from mxc.runtime.triage import classify
    from mxc.runtime.triage.compare import compare_runs

    home, _, runs = hostile_home
    sane = runs_mod.load(runs["sane"])
    unreadable = set()
    for name, run in runs.items():
        try:
            record = runs_mod.current(run)
        except UserError as exc:  # one line for the listing, never a traceback
            assert "\n" not in str(exc) and "record.json" in str(exc), (name, exc)
            unreadable.add(name)
            record = None
        verdict = classify(run.path, record)
        assert verdict.run_id == run.run_id, name
        if record is None:
            continue
        runs_mod.live_progress(run, record)
        runs_mod.shown_status(record)
        gather(run, record, with_tsdb=False).summary()
        compare_runs(Store(home), (runs["sane"], sane), (run, record))
        write_merged(run.metrics_parts, run.path / "merged.jsonl")
    assert unreadable == {name for name in HOSTILE if name.startswith("record.json is")} | {
        "record.json has a lone surrogate"}


@pytest.mark.timeout(300)
def test_runs_logs_triage_report_and_compare_on_the_cli(hostile_home: tuple[Path, str, dict[str, RunDir]],
                                                      mxc: Mxc) -> None:
    home, _, runs = hostile_home
    before = store_snapshot(home)
    listing = mxc("runs", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = {r["run_id"]: r for r in json.loads(listing.stdout)}
    assert rows[runs["record.json is a FIFO"].run_id]["status"] == "unreadable"
    assert rows[runs["train.log is a FIFO"].run_id]["status"] == "failed"
    text = mxc("runs")
    assert text.returncode == 0 and "unreadable" in text.stdout, text.stderr
    for name in ("train.log is a FIFO", "train.log is a directory"):
        out = mxc("logs", runs[name].run_id)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert "its log" in out.stderr and "not a regular file" in out.stderr
    for name in ("metrics.jsonl is deep", "metrics.jsonl is a FIFO", "events.jsonl is a FIFO", "record.json is deep",
                 "events.jsonl is misshapen", "a rank's kernel log is a FIFO"):
        for args in (["triage", runs[name].run_id, "--json"], ["report", runs[name].run_id, "--no-tsdb", "--json", "-o",
                                                               str(home.parent / "r.html")],
                     ["compare", runs["sane"].run_id, runs[name].run_id, "--json"]):
            out = mxc(*args)
            assert "Traceback" not in out.stderr, (name, args, out.stderr)
            assert out.returncode in (0, 1, 2), (name, args, out.stderr)  # compare: 1 when the runs differ
            assert out.returncode != 2 or out.stderr.count("\n") == 1, (name, args, out.stderr)
    assert {p for p in store_snapshot(home) if not p.endswith("r.html")} == set(before)


def test_json_readers_bound_depth_size_and_file_kind(tmp_path: Path) -> None:
    from mxc.fsutil import MAX_JSON_BYTES, loads, read_json, read_jsonl

    cases = {"dir": None, "fifo": None, "deep": DEEP, "binary": "\udcff", "surrogate": '{"a": "\\ud800"}',
             "bigint": '{"a": ' + "1" * 5000 + "}", "list": "[1]", "huge": '{"a": "' + "x" * 2000 + '"}'}
    for name, text in cases.items():
        path = tmp_path / name
        if name == "dir":
            path.mkdir()
        elif name == "fifo":
            os.mkfifo(path)
        elif name == "binary":
            path.write_bytes(b"\xff\xfe\x00{")
        else:
            path.write_text(text or "")
        assert read_json(path, limit=1000 if name == "huge" else MAX_JSON_BYTES) is None, name
        assert read_jsonl(path) == [] or name == "huge", name
    with pytest.raises(ValueError):
        loads("[" * 65 + "]" * 65)
    assert loads("[" * 64 + "]" * 64) is not None
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b'{"a": 1}\n' + DEEP.encode() + b"\n\xff\xfe\n" + b'{"b": "' + b"x" * (2 << 20) + b'"}\n{"c": 3}')
    assert read_jsonl(mixed) == [{"a": 1}, {"c": 3}]
    with pytest.raises(ValueError):
        RunRecord.load(tmp_path / "fifo")
    with pytest.raises(ValueError):
        RunRecord.load(tmp_path / "dir")
    with pytest.raises(FileNotFoundError):
        RunRecord.load(tmp_path / "missing")


# ---- an interpreter that prints a banner


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_host_facts_through_an_interpreter_that_prints_a_banner(tmp_path: Path) -> None:
    from mxc.runtime.provenance.hostfacts import python_facts

    banner = _script(tmp_path / "python3", f'echo "Welcome to the cluster python. Be nice."\nexec {sys.executable} "$@"\n')
    facts = python_facts(str(banner))
    assert "error" not in facts, facts
    assert "pydantic" in facts["all_packages"] and facts["executable"]
    assert facts["environment_digest"].startswith("sha256:")
    for name, body in {"silent": "exit 0\n", "garbage": "printf '\\377\\376 binary\\n'\n",
                       "misshapen": "echo 'mxc-host-facts: {\"packages\": 5}'\n",
                       "deep": "echo 'mxc-host-facts: " + "[" * 5000 + "'\n"}.items():
        odd = python_facts(str(_script(tmp_path / name, body)))
        assert odd.keys() == {"error"} and "printed no host facts" in odd["error"], (name, odd)


def test_rerun_with_a_banner_printing_interpreter(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    run_id = "20990101-000000-aaaa-" + digest[:8]
    (mxc_home / "runs" / run_id).mkdir(parents=True)
    (mxc_home / "runs" / run_id / "record.json").write_text(_record(run_id, digest, status="succeeded", exit_code=0))
    banner = _script(tmp_path / "python3", f'echo "Welcome to the cluster python"\nexec {sys.executable} "$@"\n')
    out = mxc("rerun", run_id, "--dry-run", env={"MXC_PYTHON": str(banner)})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "entrypoint.sh" in out.stdout


# ---- a malicious code.repo


MALICIOUS_REPOS = {
    "--upload-pack=touch {marker}": "starts with '-'",
    "-c core.sshCommand=touch {marker}": "starts with '-'",
    "ext::sh -c touch% {marker}": "git remote helper",
    "fd::17": "git remote helper",
    "ssh://-oProxyCommand=touch {marker}/x": "host starts with '-'",
    "git@-oProxyCommand=x:y": "starts with '-'",
    "host:--upload-pack=touch {marker}": "starts with '-'",
    "/tmp/repo\nmxc: error: forged line": "control character",
    "ftp://example.invalid/repo": "protocol 'ftp' is not allowed",
}


def _spec_with_repo(tmp: Path, repo: str) -> Path:
    spec = tmp / "repo.yaml"
    spec.write_text("\n".join(["schema: mxc/v1", "name: repo", "code:", f"  repo: {json.dumps(repo)}",
                               f"  commit: {json.dumps('a' * 40)}", "model:", "  model_name: default",
                               "runtime:", "  backend: local", "  container: native"]) + "\n")
    return spec


@pytest.mark.parametrize("template", sorted(MALICIOUS_REPOS))
def test_a_malicious_code_repo_is_refused_with_one_line(template: str, mxc: Mxc, mxc_home: Path,
                                                        tmp_path: Path) -> None:
    from mxc.lock.gitref import resolve_ref
    from mxc.runtime.provenance import codepin

    marker = tmp_path / "pwned"
    repo = template.format(marker=marker)
    why = MALICIOUS_REPOS[template]
    out = mxc("build", str(_spec_with_repo(tmp_path, repo)))
    assert out.returncode == 2 and out.stderr.startswith(f"{tmp_path / 'repo.yaml'}:4: code.repo: "), out.stderr
    assert why in out.stderr and out.stderr.count("\n") == 2, out.stderr  # the problem, then the summary line
    assert store_snapshot(mxc_home) == []
    # Bundles built before this check, and `mxc lock`, meet the same refusal in one line.
    for call in (lambda: codepin.materialise(mxc_home, repo, "a" * 40), lambda: resolve_ref(repo, "main")):
        with pytest.raises(UserError) as refused:
            call()
        assert why in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()


def test_an_allowed_url_still_clones_with_the_protocol_allow_list(mxc_home: Path, tmp_path: Path) -> None:
    import git

    from mxc.lock.gitref import resolve_ref
    from mxc.runtime.provenance import codepin

    root = tmp_path / "code"
    repo = git.Repo.init(root, initial_branch="main")
    (root / "train.py").write_text("print('hi')\n")
    repo.index.add(["train.py"])
    actor = git.Actor("mxc test", "test@example.invalid")
    commit = str(repo.index.commit("one", author=actor, committer=actor).hexsha)
    url = f"file://{root}"
    assert resolve_ref(url, "main") == commit
    pinned = codepin.materialise(mxc_home, url, commit)
    assert (pinned.dir / "train.py").read_text() == "print('hi')\n"
