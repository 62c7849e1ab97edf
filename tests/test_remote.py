"""Remote Slurm from a laptop (mxc/remote/), without Slurm: cluster profiles, the SSH transport's
errors, bundles copied by content and verified on the other side, and hostile values that must stay
data on the login node. The "login node" is this machine behind a real sshd on 127.0.0.1
(tests/remote_support.py), its mxc this repository's with a home of its own, as if on another machine.
The Slurm round trip is tests/test_remote_slurm.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mxc.remote.commands import without_option
from tests.conftest import SPECS
from tests.remote_support import BADKEY, CLOSED, LOGIN, UNKNOWN, Laptop, Sshd, login_node


@pytest.fixture
def laptop(tmp_path: Path, sshd: Sshd) -> Laptop:
    return Laptop(tmp_path, sshd)


@pytest.fixture
def remote_mxc(tmp_path: Path) -> Path:
    """The login node's mxc (this repository's), with the login node's own environment."""
    return login_node(tmp_path / "login", {"PATH": os.environ["PATH"], "MXCTEST_SCRATCH": str(tmp_path / "scratch")})


def added(laptop: Laptop, remote_mxc: Path, *extra: str, name: str = "t", login: str = LOGIN) -> str:
    out = laptop("cluster", "add", name, login, "--mxc", str(remote_mxc), *extra)
    assert out.returncode == 0, out.stderr
    return name


# ---- profiles


def test_profiles_are_added_listed_and_removed_in_their_own_file(laptop: Laptop, remote_mxc: Path) -> None:
    added(laptop, remote_mxc, "--home", "/srv/mxc home", "--runs-dir", "$SCRATCH/mxc-runs", name="hpc")
    added(laptop, remote_mxc, name="other", login="alice@login.example.org")
    listed = json.loads(laptop("cluster", "ls", "--json").stdout)
    assert listed == [
        {"name": "hpc", "login": LOGIN, "mxc": [str(remote_mxc)], "home": "/srv/mxc home", "runs_dir": "$SCRATCH/mxc-runs"},
        {"name": "other", "login": "alice@login.example.org", "mxc": [str(remote_mxc)], "home": None, "runs_dir": None}]
    text = (laptop.config / "clusters.yaml").read_text()
    assert text.startswith("# mxc cluster profiles") and "schema: mxc-clusters/v1" in text
    table = laptop("cluster", "ls").stdout.splitlines()
    assert table[0].split() == ["NAME", "LOGIN", "MXC", "HOME", "RUNS", "DIR"] and table[1].startswith("hpc ")
    again = laptop("cluster", "add", "hpc", "bob@elsewhere")
    assert again.returncode == 2 and "cluster 'hpc' exists" in again.stderr and "--replace" in again.stderr
    replaced = laptop("cluster", "add", "hpc", "bob@elsewhere", "--replace")
    assert replaced.returncode == 0 and "replaced" in replaced.stderr
    assert laptop("cluster", "rm", "other").returncode == 0
    assert [c["name"] for c in json.loads(laptop("cluster", "ls", "--json").stdout)] == ["hpc"]
    gone = laptop("runs", "--cluster", "other")
    assert gone.returncode == 2 and "no cluster named 'other'" in gone.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["bad/name", "login"], "not a cluster name"),
    (["c", "-oProxyCommand=touch /tmp/x"], "LOGIN: expected an ssh destination"),
    (["c", "user@host;id"], "LOGIN: expected an ssh destination"),
    (["c", "login", "--runs-dir", "relative/runs"], "--runs-dir: expected a path on the login node"),
    (["c", "login", "--home", "/a\nb"], "--home: expected a path on the login node"),
    (["c", "login", "--mxc", ""], "--mxc: expected the command"),
    (["c", "login", "--mxc", "'unclosed"], "--mxc"),
])
def test_bad_profile_values_are_refused_and_nothing_is_written(laptop: Laptop, args: list[str], message: str) -> None:
    out = laptop("cluster", "add", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (laptop.config / "clusters.yaml").exists()


def test_a_hand_edited_profile_file_is_checked_with_file_and_line(laptop: Laptop) -> None:
    laptop.config.mkdir(parents=True)
    (laptop.config / "clusters.yaml").write_text(
        "schema: mxc-clusters/v1\nclusters:\n  hpc:\n    login: alice@login\n    runs_dir: scratch/runs\n"
        "    password: hunter2\n")
    out = laptop("runs", "--cluster", "hpc")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert any(line.endswith("clusters.yaml:5: clusters.hpc.runs_dir: expected a path on the login node: absolute, "
                             "~/..., or starting with $VAR/ (expanded there, e.g. $SCRATCH/mxc-runs); no control "
                             "characters (fix it, or remove the profile: mxc cluster rm hpc)") for line in lines), lines
    assert any(":6: clusters.hpc.password: unknown key" in line for line in lines), lines


def test_the_cluster_option_is_taken_out_of_the_command_line_sent() -> None:
    assert without_option(["logs", "--cluster", "hpc", "RUN", "-f"], "--cluster") == ["logs", "RUN", "-f"]
    assert without_option(["logs", "--cluster=hpc", "RUN"], "--cluster") == ["logs", "RUN"]
    assert without_option(["runs", "--clus", "hpc", "-n", "3"], "--cluster") == ["runs", "-n", "3"]
    assert without_option(["logs", "--grep=--cluster", "RUN"], "--cluster") == ["logs", "--grep=--cluster", "RUN"]
    assert without_option(["logs", "--config", "RUN"], "--cluster") == ["logs", "--config", "RUN"]


# ---- the connection


def test_check_reports_the_remote_mxc_and_reuses_one_connection(laptop: Laptop, remote_mxc: Path, sshd: Sshd) -> None:
    added(laptop, remote_mxc, "--runs-dir", "$MXCTEST_SCRATCH/mxc-runs")
    first = laptop("cluster", "check", "t", "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    assert info["version_matches"] is True and info["problems"] == [] and info["sbatch"]
    assert info["runs"] == str(laptop.root / "scratch" / "mxc-runs"), "the $VAR is expanded on the login node"
    logins = sshd.log.read_text().count("Accepted publickey")
    for _ in range(2):
        assert laptop("cluster", "check", "t").returncode == 0
    assert sshd.log.read_text().count("Accepted publickey") == logins, "later commands log in again"


@pytest.mark.parametrize(("login", "code", "message"), [
    (CLOSED, 1, "cannot reach mxc-test-closed: the host refused the connection"),
    (BADKEY, 2, "cannot reach mxc-test-badkey: the login was refused (mxc logs in with your ssh set-up"),
    (UNKNOWN, 2, "cannot reach mxc-test-unknown: its host key is unknown or changed (check and accept it once"),
])
def test_ssh_failures_are_one_line(laptop: Laptop, remote_mxc: Path, login: str, code: int, message: str) -> None:
    added(laptop, remote_mxc, login=login)
    out = laptop("runs", "--cluster", "t")
    assert out.returncode == code and out.stderr.startswith(f"mxc: error: cluster t: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_missing_remote_mxc_is_one_line(laptop: Laptop, tmp_path: Path) -> None:
    out = laptop("cluster", "add", "t", LOGIN, "--mxc", str(tmp_path / "no such dir" / "mxc"), "--check")
    assert out.returncode == 2
    assert f"mxc: error: cluster t: mxc was not found on {LOGIN}" in out.stderr and "--mxc /path/to/mxc" in out.stderr
    assert "Traceback" not in out.stderr


def test_another_mxc_version_there_is_refused(laptop: Laptop, tmp_path: Path) -> None:
    older = tmp_path / "older-mxc"
    older.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys, mxc; mxc.__version__ = \"0.0.9\"; "
                     "import mxc.cli.main as m; m.__version__ = \"0.0.9\"; import mxc.remote.agent as a; "
                     "a.__version__ = \"0.0.9\"; sys.argv[0] = \"mxc\"; sys.exit(m.main())' \"$@\"\n")
    older.chmod(0o755)
    added(laptop, older)
    runs = laptop("runs", "--cluster", "t")
    assert runs.returncode == 2
    assert "mxc on " in runs.stderr and " is 0.0.9, the mxc that called it is 0.1.0: refusing" in runs.stderr
    check = laptop("cluster", "check", "t")
    assert check.returncode == 1 and "mxc there is 0.0.9, here 0.1.0" in check.stderr


# ---- bundles copied by content


def test_push_copies_what_the_store_lacks_once_and_repairs_a_damaged_copy(laptop: Laptop, remote_mxc: Path,
                                                                          tmp_path: Path) -> None:
    remote_home = tmp_path / "remote-home"
    added(laptop, remote_mxc, "--home", str(remote_home))
    bundle = laptop.build("--set", "runtime.backend=slurm")
    first = json.loads(laptop("cluster", "push", "t", bundle, "--json").stdout)
    assert first["copied"] is True and first["files"] > 10 and first["bytes"] > 0
    stored = remote_home / "bundles" / bundle
    assert sorted(p.name for p in stored.iterdir()) == sorted(p.name for p in (laptop.home / "bundles" / bundle).iterdir())
    verify = subprocess.run([str(remote_mxc), "verify", bundle], env={**os.environ, "MXC_HOME": str(remote_home)},
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    second = laptop("cluster", "push", "t", bundle)
    assert second.returncode == 0 and "is in its store already (nothing copied)" in second.stderr
    # Damaged on the cluster (someone wrote into the store): the next push sends it again and it is repaired.
    env_sh = stored / "env.sh"
    stored.chmod(0o755)
    env_sh.chmod(0o644)
    env_sh.write_text(env_sh.read_text() + "export EVIL=1\n")
    third = json.loads(laptop("cluster", "push", "t", bundle, "--json").stdout)
    assert third["copied"] is True
    assert "EVIL" not in env_sh.read_text() and subprocess.run(
        [str(remote_mxc), "verify", bundle], env={**os.environ, "MXC_HOME": str(remote_home)}).returncode == 0


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_the_receiving_side_refuses_anything_but_the_named_bundle(laptop: Laptop, tmp_path: Path) -> None:
    bundle = laptop.build("--set", "runtime.backend=slurm")
    source = laptop.home / "bundles" / bundle
    files = {p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*") if p.is_file()}
    remote_home = tmp_path / "remote-home"

    def receive(stream: bytes) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mxc", "remote-agent", "--home", str(remote_home), "receive", bundle],
                              input=stream.decode("latin-1"), env=os.environ, capture_output=True, text=True,
                              encoding="latin-1")

    changed = {**files, "env.sh": files["env.sh"] + b"export EVIL=1\n"}
    extra = {**files, "mxc_node/sitecustomize.py": b"import os\n"}
    escaping = {**files, "../outside": b"x"}
    for stream, message in [(_tar(changed), "has env.sh changed"),
                            (_tar(extra), "does not hold exactly its manifest's files (mxc_node/sitecustomize.py)"),
                            (_tar(escaping), "holds '../outside', not a bundle file"),
                            (b"not a tar stream", "is not a tar stream")]:
        out = receive(stream)
        assert out.returncode == 2 and message in out.stderr, out.stderr
        assert not (remote_home / "bundles" / bundle).exists()
    assert not (remote_home.parent / "outside").exists()
    good = receive(_tar(files))
    assert good.returncode == 0 and json.loads(good.stdout)["state"] == "built"


def test_submit_asks_for_the_bundle_and_refuses_a_short_one_or_another_command(laptop: Laptop,
                                                                              tmp_path: Path) -> None:
    """``remote-agent submit`` (``mxc run --cluster``'s one call): the store lacks the bundle, so it asks
    for it on stdout and reads one length-prefixed frame from stdin; a frame cut short or too large, or a
    command other than ``run`` of that bundle, is one line and exit 2 with nothing stored and nothing run."""
    from mxc.remote.sync import MARK, frame, pack

    bundle = laptop.build("--set", "runtime.backend=slurm")
    data, _ = pack(laptop.home / "bundles" / bundle, bundle)
    remote_home = tmp_path / "remote-home"

    def submit(stream: bytes, *argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "mxc", "remote-agent", "--home", str(remote_home), "submit",
                               bundle, *argv], input=stream, capture_output=True,
                              env={**os.environ, "SLURM_CONF": str(tmp_path / "no-slurm-here.conf")})

    for stream, argv, message in [
            (frame(data)[:-100], ["run", bundle, "-y"], f"the bundle sent ended after {len(data) - 100} of"),
            (b"999999999999\n", ["run", bundle, "-y"], "bytes: refused (at most"),
            (b"", ["run", bundle, "-y"], "the bundle was not sent"),
            (frame(data), ["runs"], "the command must be run"),
            (frame(data), ["run", "@", "-y"], "the command must be run")]:
        out = submit(stream, *argv)
        assert out.returncode == 2 and message in out.stderr.decode(), out.stderr
        assert not (remote_home / "bundles" / bundle).exists()
    # A whole frame is stored (verified) before the run (this "login node" has no Slurm: the run then fails).
    out = submit(frame(data), "run", bundle, "-y")
    said = out.stdout.decode().splitlines()
    assert said[:2] == [f"{MARK} {bundle} wanted", f"{MARK} {bundle} stored"], said
    assert out.returncode != 0 and b"Traceback" not in out.stderr, out.stderr
    assert (remote_home / "bundles" / bundle / "manifest.json").is_file()
    again = submit(b"", "run", bundle, "-y")
    assert again.stdout.decode().splitlines()[:1] == [f"{MARK} {bundle} present"]


# ---- hostile values stay data


def test_hostile_paths_reach_the_login_node_as_data(laptop: Laptop, remote_mxc: Path, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    hostile = f"{tmp_path}/home with spaces 'q\" $(touch {canary}) `touch {canary}` ; touch {canary}"
    added(laptop, remote_mxc, "--home", hostile, "--runs-dir", hostile + "/runs $HOME")
    bundle = laptop.build("--set", "runtime.backend=slurm")
    out = laptop("cluster", "push", "t", bundle, "--json")
    assert out.returncode == 0, out.stderr
    assert (Path(hostile) / "bundles" / bundle / "manifest.json").is_file(), "the store is at the literal path"
    info = json.loads(laptop("cluster", "check", "t", "--json").stdout)
    assert info["home"] == hostile and info["runs"] == hostile + "/runs $HOME"
    runs = laptop("runs", "--cluster", "t", "--json")
    assert runs.returncode == 0 and json.loads(runs.stdout) == []
    assert not canary.exists()


def test_an_unset_variable_in_a_remote_path_is_named(laptop: Laptop, remote_mxc: Path) -> None:
    added(laptop, remote_mxc, "--runs-dir", "${MXCTEST_NOT_SET}/runs")
    out = laptop("runs", "--cluster", "t")
    assert out.returncode == 2 and "runs_dir ${MXCTEST_NOT_SET}/runs: $MXCTEST_NOT_SET is not set on" in out.stderr


# ---- run --cluster refusals (nothing sent)


def test_run_refuses_a_local_bundle_and_an_unconfirmed_submission_before_sending(laptop: Laptop, remote_mxc: Path,
                                                                                 tmp_path: Path) -> None:
    remote_home = tmp_path / "remote-home"
    added(laptop, remote_mxc, "--home", str(remote_home))
    local = laptop("build", "-q", str(SPECS / "tiny.yaml")).stdout.strip()
    out = laptop("run", "--cluster", "t", local, "-y")
    assert out.returncode == 2 and "runtime.backend: local" in out.stderr and "runtime.backend=slurm" in out.stderr
    slurm = laptop.build("--set", "runtime.backend=slurm")
    unasked = laptop("run", "--cluster", "t", slurm)
    assert unasked.returncode == 2 and "without confirmation: stdin is not a terminal" in unasked.stderr
    label = laptop("run", "--cluster", "t", slurm, "-y", "--label", "$(touch x)")
    assert label.returncode == 2 and "is not a label" in label.stderr
    both = laptop("run", "--cluster", "t", slurm, "-y", "--local")
    assert both.returncode == 2 and "--local and --cluster" in both.stderr
    assert not (remote_home / "bundles").exists(), "a refused run sent its bundle"


def test_run_sends_the_bundle_in_the_submitting_call_and_a_runs_root_slurm_cannot_export_is_refused(
        laptop: Laptop, remote_mxc: Path, tmp_path: Path) -> None:
    """The bundle goes in the same call as the submission (the login node's mxc asks for it when its
    store lacks it), verified before the run; then the submission itself refuses a runs root sbatch
    --export cannot carry (it splits on commas, refuses quotes, and the job then started without
    MXC_RUN_DIR and failed): exit 2 before anything is queued, so no Slurm is needed here. The round
    trip with Slurm is tests/test_remote_slurm.py."""
    remote_home, quoted = tmp_path / "remote-home", tmp_path / "it's runs"
    added(laptop, remote_mxc, "--home", str(remote_home), "--runs-dir", str(quoted))
    bundle = laptop.build("--set", "runtime.backend=slurm")
    first = laptop("run", "--cluster", "t", bundle, "-y", timeout=120)
    assert first.returncode == 2, first.stderr
    assert f"bundle {bundle[:12]} copied (" in first.stderr and "verified there" in first.stderr
    assert "cannot be passed to sbatch --export" in first.stderr and "quotes" in first.stderr
    assert (remote_home / "bundles" / bundle / "manifest.json").is_file()
    again = laptop("run", "--cluster", "t", bundle, "-y", timeout=120)
    assert again.returncode == 2 and "is in its store already (nothing copied)" in again.stderr, again.stderr
    assert not quoted.exists() or not any(quoted.iterdir()), "a run was left behind"
