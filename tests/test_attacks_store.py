"""Attacks on the bundle store and what it runs (issue [1/6]): a planted template cache, bundles
changed after the build (before a run, a rerun, a restart), killed builds,
hand-made and malformed manifests, `show --file` outside the bundle, damaged copies a rebuild
must repair, and a file system that is full.

Each test reproduces one attack through the real CLI (or the real function the CLI calls) and
asserts what must hold: one line and exit 1/2, nothing executed, nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from mxc import __version__
from mxc.compiler import render
from mxc.runtime.record import RunRecord
from tests.conftest import REPO, RUNNABLE_SPECS, Mxc, store_snapshot

TINY = str(REPO / "specs/tiny.yaml")


def one_line(out: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert out.returncode == code, out.stdout + out.stderr
    assert out.stderr.startswith("mxc: error: ") and out.stderr.count("\n") == 1, out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


def build(mxc: Mxc, *args: str) -> str:
    out = mxc("build", *args, "-q")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def writable(path: Path) -> Path:
    """A bundle file (or directory) made writable, as anyone with access to the store can."""
    path.chmod(0o755 if path.is_dir() else 0o644)
    return path


def tamper(bundle: Path, name: str = "env.sh", extra: str = "export SNEAKY=1\n") -> None:
    writable(bundle)
    target = writable(bundle / name)
    target.write_text(target.read_text() + extra)


# ---- 1. the template cache: nothing in MXC_HOME is ever executed


def test_a_planted_template_cache_is_never_loaded(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """Whoever can write MXC_HOME used to run code in every `mxc build` through jinja's bytecode cache."""
    marker = tmp_path / "pwned"
    cache = jinja2.FileSystemBytecodeCache(str(mxc_home / "cache" / f"templates-{__version__}"))
    Path(cache.directory).mkdir(parents=True)
    env = render._ENV.overlay(cache_size=0)
    assert env.loader is not None
    for name in env.loader.list_templates():
        source, filename, _ = env.loader.get_source(env, name)
        bucket = cache.get_bucket(env, name, filename, source)
        bucket.code = compile(f"open({str(marker)!r}, 'w').write('ran')", "<planted>", "exec")
        cache.set_bucket(bucket)
    out = mxc("build", TINY, "-q")
    assert not marker.exists(), "code from $MXC_HOME/cache ran during the build"
    assert out.returncode == 0, out.stderr
    digest = out.stdout.strip()
    assert build(mxc, TINY) == digest
    clean = mxc("build", TINY, "-q", env={"MXC_HOME": str(tmp_path / "clean-home")})
    assert clean.stdout.strip() == digest


def test_shipped_precompiled_templates_are_current_and_render_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from mxc.compiler.precompiled import PrecompiledLoader

    loader = render._ENV.loader
    assert isinstance(loader, PrecompiledLoader)
    assert loader.stale(render._ENV) == [], (
        "mxc/compiler/data/compiled_templates.json is out of date: run python tools/gen_compiled_templates.py")
    from mxc.build import compile_file

    precompiled = {spec.name: compile_file(str(spec)).files for spec in RUNNABLE_SPECS}
    from_source = render._ENV.overlay(loader=jinja2.PackageLoader("mxc.compiler", "templates"), cache_size=0)
    monkeypatch.setattr(render, "_ENV", from_source)
    for spec in RUNNABLE_SPECS:
        assert compile_file(str(spec)).files == precompiled[spec.name], spec.name


# ---- 2. a bundle changed after it was built is never used


def test_rerun_verifies_the_bundle_before_reading_any_of_it(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A changed spec.json naming another interpreter ran that interpreter (host facts) before the hash check."""
    digest = build(mxc, TINY)
    bundle = mxc_home / "bundles" / digest
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil-python"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\n")
    evil.chmod(0o755)
    spec = json.loads((bundle / "spec.json").read_text())
    spec["runtime"]["python"] = str(evil)
    writable(bundle)
    writable(bundle / "spec.json").write_text(json.dumps(spec))
    run_id = "20990101-000000-aaaa-" + digest[:8]
    (mxc_home / "runs" / run_id).mkdir(parents=True)
    record = RunRecord(run_id=run_id, bundle=digest, spec_name="tiny", backend="local", status="succeeded",
                       final=True, started="2099-01-01T00:00:00.000Z")
    (mxc_home / "runs" / run_id / "record.json").write_text(record.model_dump_json())
    before = store_snapshot(mxc_home)
    env = {k: v for k, v in os.environ.items() if k != "MXC_PYTHON"}
    out = subprocess.run([sys.executable, "-m", "mxc", "rerun", run_id, "--dry-run"], cwd=REPO, capture_output=True,
                         text=True, env={**env, "MXC_HOME": str(mxc_home)})
    assert not marker.exists(), "the interpreter named by the changed spec.json ran"
    one_line(out, 2, f"bundle {digest[:12]} is damaged: spec.json: changed", f"mxc verify {digest[:12]}")
    assert store_snapshot(mxc_home) == before


FAKE_TRAIN = '''\
"""Stand-in for MaxText: attempt 0 completes a step, changes the bundle it runs from, and is killed."""
import os, sys

attempt = int(os.environ["MXC_ATTEMPT"])
open(os.path.join(os.environ["MXC_RUN_DIR"], "ran-%d" % attempt), "w").close()
print("completed step: 0, seconds: 0.001, total_weights: 64, loss: 1.000", file=sys.stderr, flush=True)
if attempt == 0:
    bundle = os.environ["MXC_BUNDLE_DIR"]
    os.chmod(bundle, 0o755)
    os.chmod(os.path.join(bundle, "env.sh"), 0o644)
    with open(os.path.join(bundle, "env.sh"), "a") as fh:
        fh.write("export LD_PRELOAD=/tmp/evil.so\\n")
    os.kill(os.getpid(), 9)  # killed from outside: the restart policy restarts that (an exit 1 it would not)
'''


def _fake_maxtext(root: Path) -> str:
    import git

    repo = git.Repo.init(root)
    train = root / "src/maxtext/trainers/pre_train/train.py"
    train.parent.mkdir(parents=True)
    for pkg in ("src/maxtext", "src/maxtext/trainers", "src/maxtext/trainers/pre_train"):
        (root / pkg / "__init__.py").write_text("")
        repo.index.add([f"{pkg}/__init__.py"])
    train.write_text(FAKE_TRAIN)
    repo.index.add([str(train.relative_to(root))])
    actor = git.Actor("mxc test", "test@example.invalid")
    return str(repo.index.commit("fake", author=actor, committer=actor).hexsha)


def test_a_restart_refuses_a_bundle_changed_during_the_run(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The local supervisor verifies the bundle before every attempt: a crash after the bundle was
    edited fails the run naming the file, instead of restarting whatever the bundle now holds."""
    commit = _fake_maxtext(tmp_path / "fake-maxtext")
    spec = tmp_path / "restarts.yaml"
    spec.write_text("\n".join([
        "schema: mxc/v1", "name: restarts", "code:", f"  repo: {json.dumps(str(tmp_path / 'fake-maxtext'))}",
        f"  commit: {json.dumps(commit)}", "model:", "  model_name: default", "  overrides:", "    steps: 4",
        "runtime:", "  backend: local", "  container: native", "  preflight:", "    stale_processes: false",
        "    min_free_gb: 0", "restart:", "  max: 2"]) + "\n")
    digest = build(mxc, str(spec))
    out = mxc("run", digest, "--json")
    assert out.returncode == 1, out.stderr
    record = json.loads(out.stdout)
    assert record["status"] == "failed" and record["final"] is True
    assert [a["number"] for a in record["attempts"]] == [0, 1]
    assert record["attempts"][0]["exit_code"] == 137
    assert record["attempts"][1]["reason"].startswith(f"not started: bundle {digest[:12]} is damaged: env.sh: changed")
    assert "attempt 1 not started" in record["message"]
    run = mxc_home / "runs" / record["run_id"]
    assert (run / "ran-0").exists() and not (run / "ran-1").exists()
    assert "[mxc] attempt 1: not started: bundle" in (run / "train.log").read_text()


# ---- 3. store crashes: killed builds, bad bundles, show --file, repair


def test_build_removes_abandoned_temp_dirs_and_keeps_live_ones(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    bundles = mxc_home / "bundles"
    bundles.mkdir(parents=True)
    host = socket.gethostname().replace("-", "_")
    dead = subprocess.Popen(["true"])
    dead.wait()
    hour_ago = os.stat(bundles).st_mtime - 7200
    dirs = {
        "dead": bundles / f".tmp-{host}-{dead.pid}-abcd1234",  # its build was killed: removed
        "live": bundles / f".tmp-{host}-{os.getpid()}-efgh5678",  # a concurrent build (this process): kept
        "remote": bundles / ".tmp-otherhost-1-ijkl9012",  # another host's, fresh: kept
        "remote_old": bundles / ".tmp-otherhost-2-mnop3456",  # another host's, hours old: removed
        "old_style": bundles / ".tmp-qrst7890",  # mxc before this change, hours old: removed
    }
    for path in dirs.values():
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "file").write_text("x")
        (path / "sub" / "file").chmod(0o444)
        (path / "sub").chmod(0o555)
        path.chmod(0o555)
    for key in ("remote_old", "old_style"):
        os.utime(dirs[key], (hour_ago, hour_ago))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (bundles / ".tmp-link").symlink_to(outside)
    build(mxc, TINY)
    left = {key for key, path in dirs.items() if path.exists()}
    assert left == {"live", "remote"}
    assert (outside / "keep").exists() and (bundles / ".tmp-link").is_symlink()


def test_ls_lists_every_bundle_when_one_spec_json_is_bad(mxc: Mxc, mxc_home: Path) -> None:
    good = build(mxc, TINY)
    bad = build(mxc, TINY, "--set", "model.overrides.steps=7")
    tamper(mxc_home / "bundles" / bad, "spec.json", "\x00garbage")
    out = mxc("ls", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["hash"]: r for r in json.loads(out.stdout)}
    assert rows[good]["name"] == "tiny" and "damaged" not in rows[good]
    assert "spec.json: changed" in rows[bad]["damaged"]
    text = mxc("ls")
    assert text.returncode == 0 and f"(damaged: mxc verify {bad[:12]})" in text.stdout


def _hand_made(home: Path, manifest: bytes, files: dict[str, bytes] | None = None) -> str:
    """A bundle directory named by the hash of ``manifest`` (so only its shape can be wrong)."""
    digest = hashlib.sha256(manifest).hexdigest()
    root = home / "bundles" / digest
    root.mkdir(parents=True)
    (root / "manifest.json").write_bytes(manifest)
    for name, data in (files or {}).items():
        (root / name).write_bytes(data)
    return digest


SPEC = json.dumps({"name": "x", "runtime": {"backend": "local"}}).encode()
MALFORMED = {
    "list": (b"[1, 2]", "not a JSON object"),
    "no files": (b'{"format": "mxc-bundle/v1"}', "no 'files' object"),
    "files a list": (b'{"files": ["spec.json"]}', "no 'files' object"),
    "hash not a string": (b'{"files": {"spec.json": 5}}', "file spec.json has no sha256"),
    "parent name": (json.dumps({"files": {"../x": hashlib.sha256(b"x").hexdigest()}}).encode(), "'../x' is not allowed"),
    "absolute name": (json.dumps({"files": {"/etc/passwd": "0" * 64}}).encode(), "'/etc/passwd' is not allowed"),
    "deep name": (json.dumps({"files": {"a/b/c": "0" * 64}}).encode(), "'a/b/c' is not allowed"),
    "hidden name": (json.dumps({"files": {".x": "0" * 64}}).encode(), "'.x' is not allowed"),
    "deep json": (b'{"files": ' + b"[" * 100000 + b"]" * 100000 + b"}", "malformed"),
    "binary": (b"\xff\xfe\x00garbage", "not JSON"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifests_are_one_line_everywhere(case: str, mxc: Mxc, mxc_home: Path) -> None:
    manifest, why = MALFORMED[case]
    digest = _hand_made(mxc_home, manifest, {"spec.json": SPEC})
    verify = mxc("verify", digest[:12])
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr
    assert verify.stdout.startswith(f"{digest[:12]}: manifest.json: malformed: ") and why in verify.stdout, verify.stdout
    assert verify.stdout.count("\n") == 1
    for args in (["show", digest[:12]], ["show", digest[:12], "--file", "spec.json"], ["run", digest[:12], "--dry-run"],
                 ["ls"]):
        out = mxc(*args)
        assert "Traceback" not in out.stderr, (args, out.stderr)
        if args[0] != "ls":
            one_line(out, 2, f"bundle {digest[:12]} is damaged: manifest.json: malformed")
    assert mxc("verify", "--all").returncode == 1


def test_show_file_reads_only_listed_verified_files_inside_the_bundle(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    digest = build(mxc, TINY)
    bundle = mxc_home / "bundles" / digest
    good = mxc("show", digest[:12], "--file", "job.sbatch")
    assert good.returncode == 0 and good.stdout == (bundle / "job.sbatch").read_text()
    secret = tmp_path / "secret"
    secret.write_text("TOP SECRET\n")
    for name in ("../../last-build", str(secret), "../" + digest + "/env.sh"):
        out = mxc("show", digest[:12], "--file", name)
        one_line(out, 2, f"has no file '{name}'")
        assert out.stdout == ""
    tamper(bundle, "job.sbatch", "echo injected\n")
    changed = mxc("show", digest[:12], "--file", "job.sbatch")
    one_line(changed, 2, "job.sbatch: changed")
    assert "injected" not in changed.stdout
    # A manifest that lists an outside file (a consistent, hand-made bundle) still reads nothing outside.
    listing = json.dumps({"files": {"spec.json": hashlib.sha256(SPEC).hexdigest(),
                                    "link": hashlib.sha256(b"TOP SECRET\n").hexdigest()}}).encode()
    made = _hand_made(mxc_home, listing, {"spec.json": SPEC})
    (mxc_home / "bundles" / made / "link").symlink_to(secret)
    linked = mxc("show", made[:12], "--file", "link")
    one_line(linked, 2, "link: a symbolic link, not a file")
    assert "TOP SECRET" not in linked.stdout


@pytest.mark.parametrize("damage", ["changed file", "extra file", "missing file", "replaced by a file"])
def test_rebuild_repairs_a_damaged_bundle_and_says_so(damage: str, mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc, TINY)
    bundle = mxc_home / "bundles" / digest
    expected = {"changed file": "env.sh: changed", "extra file": "sneaky.sh: not in the manifest",
                "missing file": "env.sh: missing", "replaced by a file": "not a directory"}[damage]
    if damage == "changed file":
        tamper(bundle)
    elif damage == "extra file":
        writable(bundle)
        (bundle / "sneaky.sh").write_text("echo hi\n")
    elif damage == "missing file":
        writable(bundle)
        (bundle / "env.sh").unlink()
    else:
        from mxc import tempdirs

        tempdirs.remove(bundle)
        bundle.write_text("not a bundle\n")
    assert mxc("verify", digest[:12]).returncode == 1
    again = mxc("build", TINY, "--json")
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["created"] is True and any(expected in p for p in result["repaired"]), result
    text = mxc("build", TINY)
    assert "unchanged" in text.stderr  # repaired for good
    verify = mxc("verify", digest[:12])
    assert verify.returncode == 0 and verify.stdout == f"{digest[:12]}: ok\n"
    assert not [p for p in (mxc_home / "bundles").iterdir() if p.name.startswith(".tmp-")]


def test_repair_message_on_the_terminal(mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc, TINY)
    tamper(mxc_home / "bundles" / digest)
    out = mxc("build", TINY)
    assert out.returncode == 0 and out.stdout.strip() == digest
    assert "tiny: repaired: the stored copy was damaged (env.sh: changed" in out.stderr
    assert "replaced by this build" in out.stderr


def test_manifest_names_confined_to_the_bundle() -> None:
    from mxc.node import integrity

    ok = ["env.sh", "job.sbatch", "mxc_node/__main__.py", "lock.json", "a-b_c.d"]
    bad = ["", ".", "..", "../x", "/etc/x", "a/../b", "a//b", ".hidden", "a/.b", "a/b/c", "manifest.json", "a\nb",
           "x" * 200, "sp ace", "back\\slash", 5, None]
    assert [n for n in ok if not integrity.valid_name(n)] == []
    assert [n for n in bad if integrity.valid_name(n)] == []


def test_subdirectory_files_are_stored_and_verified(tmp_path: Path) -> None:
    """One level of directory (the node program's mxc_node/) is allowed, and covered like any file."""
    from mxc.compiler.manifest import build_manifest, bundle_hash
    from mxc.store import Store

    files = {"spec.json": "{}\n", "mxc_node/__main__.py": "print('node')\n"}
    manifest = build_manifest(files, "test")
    digest = bundle_hash(manifest)
    stored, outcome = Store(tmp_path).put({**files, "manifest.json": manifest}, digest)
    assert outcome.state == "built" and Store(tmp_path).verify(stored) == []
    node = stored.path / "mxc_node"
    node.chmod(0o755)
    (node / "__pycache__").mkdir()  # bytecode python would load instead of the hashed source
    assert Store(tmp_path).verify(stored) == ["mxc_node/__pycache__: not in the manifest"]
    (stored.path / "\x1b[2Jforged").write_text("")  # a name that would drive the terminal
    assert Store(tmp_path).verify(stored) == ["'\\x1b[2Jforged': not in the manifest",
                                              "mxc_node/__pycache__: not in the manifest"]


def test_the_node_side_check_runs_under_the_system_python(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The same function, copied alone as the node program ships it, run by a compute node's own
    python3 outside any virtualenv: intact, then changed."""
    import shutil

    digest = build(mxc, TINY)
    bundle = mxc_home / "bundles" / digest
    shutil.copy(REPO / "mxc/node/integrity.py", tmp_path / "integrity.py")
    code = "import json, sys, integrity; print(json.dumps(integrity.check(sys.argv[1], sys.argv[2])))"

    def node_check() -> list[str]:
        out = subprocess.run(["/usr/bin/python3", "-E", "-s", "-B", "-c", code, str(bundle), digest], cwd=tmp_path,
                             capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert out.returncode == 0, out.stderr
        problems: list[str] = json.loads(out.stdout)
        return problems

    assert node_check() == []
    tamper(bundle, "entrypoint.sh", "echo injected\n")
    assert node_check() == ["entrypoint.sh: changed (sha256 differs from the manifest)"]


# ---- 4. a full disk: one line, nothing half-written


def _limited(limit: int) -> None:
    """In the child: files may grow to ``limit`` bytes, and beyond it writes fail with EFBIG (no signal)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _mxc_limited(home: Path, limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mxc", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "MXC_HOME": str(home)}, preexec_fn=lambda: _limited(limit))


def test_build_on_a_full_file_system_is_one_line_and_writes_nothing(mxc_home: Path) -> None:
    out = _mxc_limited(mxc_home, 4096, "build", "specs/70b.yaml")  # entrypoint.sh is larger than 4 KB
    one_line(out, 1, "cannot write bundle", "File too large", "nothing was left half-written")
    assert [p.name for p in (mxc_home / "bundles").iterdir()] == []


def test_run_start_on_a_full_file_system_is_one_line_and_leaves_no_run(mxc: Mxc, mxc_home: Path) -> None:
    build(mxc, TINY)
    before = store_snapshot(mxc_home)
    out = _mxc_limited(mxc_home, 256, "run", "--local", "-q")  # the first record is larger than 256 bytes
    one_line(out, 1, "cannot write the record of run", "File too large")
    runs = mxc_home / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
    assert [p for p in store_snapshot(mxc_home) if p != "runs"] == before
