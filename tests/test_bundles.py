"""Bundles: deterministic, hash-addressed, verifiable, with generated scripts that lint clean."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, RUNNABLE_SPECS, Mxc, copy_specs, store_snapshot


def build(mxc: Mxc, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    result = mxc("build", *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_same_spec_same_hash_from_another_directory_and_home(mxc: Mxc, tmp_path: Path) -> None:
    here = {spec.name: build(mxc, str(spec.relative_to(REPO))) for spec in RUNNABLE_SPECS}
    elsewhere = tmp_path / "some" / "other place"
    shutil.copytree(REPO / "specs", elsewhere / "specs")
    other_home = tmp_path / "other-home"
    there = {
        spec.name: build(mxc, f"specs/{spec.name}", cwd=elsewhere, env={"MXC_HOME": str(other_home), "USER": "someone"})
        for spec in RUNNABLE_SPECS
    }
    assert here == there
    assert len(set(here.values())) == len(here)
    # Nothing of the build machine leaks into a bundle.
    user = getpass.getuser()
    for digest in there.values():
        for f in (other_home / "bundles" / digest).rglob("*"):
            if f.is_dir():
                continue
            text = f.read_text()
            assert str(tmp_path) not in text and str(REPO) not in text, f
            assert f"/{user}/" not in text and "/home/" not in text, f


def test_rebuild_is_a_noop_and_set_changes_the_hash(mxc: Mxc, mxc_home: Path) -> None:
    first = build(mxc, "specs/tiny.yaml")
    snapshot = store_snapshot(mxc_home)
    again = mxc("build", "specs/tiny.yaml")
    assert again.stdout.strip() == first and "unchanged" in again.stderr
    assert store_snapshot(mxc_home) == snapshot
    changed = build(mxc, "specs/tiny.yaml", "--set", "model.overrides.steps=20")
    assert changed != first
    assert build(mxc, "specs/tiny.yaml", "--set", "model.overrides.steps=20") == changed
    spec = json.loads((mxc_home / "bundles" / changed / "spec.json").read_text())
    assert spec["model"]["overrides"]["steps"] == 20


def test_bundle_files_are_read_only_and_hash_is_the_manifest_hash(mxc: Mxc, mxc_home: Path) -> None:
    import hashlib

    digest = build(mxc, "specs/70b.yaml")
    bundle = mxc_home / "bundles" / digest
    manifest = (bundle / "manifest.json").read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == digest
    listed = json.loads(manifest)["files"]
    files = {str(p.relative_to(bundle)): p for p in bundle.rglob("*") if p.is_file()}
    assert set(listed) | {"manifest.json"} == set(files)
    assert {"spec.json", "run.json", "job.sbatch", "entrypoint.sh", "env.sh", "prometheus.yml", "exporter.json",
            "mxc_node/__main__.py", "mxc_node/rank.py", "mxc_node/batch.py"} <= set(listed)
    node_program = sorted(p.name for p in (REPO / "mxc" / "node").glob("*.py"))
    assert sorted(n.removeprefix("mxc_node/") for n in listed if n.startswith("mxc_node/")) == node_program
    for name, f in files.items():
        assert not f.stat().st_mode & 0o222, f
        assert hashlib.sha256(f.read_bytes()).hexdigest() == listed.get(name, hashlib.sha256(manifest).hexdigest())
        if name.startswith("mxc_node/"):  # verbatim: the node program as the repository has it
            assert f.read_bytes() == (REPO / "mxc" / "node" / f.name).read_bytes()
    assert not (bundle / "mxc_node").stat().st_mode & 0o222
    assert not list((mxc_home / "bundles").glob(".tmp-*"))


@pytest.mark.parametrize("spec", RUNNABLE_SPECS, ids=lambda p: p.name)
def test_generated_scripts_pass_bash_n_and_shellcheck(spec: Path, mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc, str(spec))
    bundle = mxc_home / "bundles" / digest
    scripts = [bundle / n for n in ("entrypoint.sh", "job.sbatch", "env.sh")]
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    lint = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", *map(str, scripts)],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    env_lines = (bundle / "env.sh").read_text().splitlines()
    # Every value single-quoted; a joined one (env.merge, XLA_FLAGS by default) has the shell's own value
    # before (append) or after (prepend) it, in a double-quoted ${NAME:+...} of the same variable.
    joined = re.compile(r"""export (\w+)=(?:"\$\{\1:\+\$\1[ :]\}")?'[^']*'(?:"\$\{\1:\+[ :]\$\1\}")?""")
    assert env_lines and all(joined.fullmatch(line) for line in env_lines), env_lines


# MaxText string keys (catalog 0.2.5) that carry the payloads as overrides: `mxc build` refuses
# unknown keys, so the attack goes through keys MaxText really takes as free text.
TEXT_KEYS = ["default_prompt", "chat_template", "dataset_name", "eval_split", "generate_slice", "audio_placeholder"]
INJECTIONS = [
    "$(touch {m})", "`touch {m}`", "x'; touch {m}; echo '", "a\nb; touch {m}", '"; touch {m}; "', "${{IFS}}touch${{IFS}}{m}",
]


def test_injection_strings_stay_inert_in_every_script(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payloads = [p.format(m=marker) for p in INJECTIONS]
    q = json.dumps  # a JSON string is a YAML double-quoted scalar: newlines and quotes survive
    # Variables and overrides are run-time templates (braces doubled for literal ones); the node
    # program fills them in, so the trainer gets the payloads themselves.
    templates = [p.replace("{", "{{").replace("}", "}}") for p in payloads]
    spec = tmp_path / "evil.yaml"
    copy_specs(tmp_path)
    spec.write_text(
        "extends: specs/tiny.yaml\n"
        "env:\n  vars:\n" + "".join(f"    EVIL_{i}: {q(p)}\n" for i, p in enumerate(templates))
        + "model:\n  overrides:\n" + "".join(f"    {key}: {q(p)}\n" for key, p in zip(TEXT_KEYS, templates, strict=True))
        + f"runtime:\n  python: {q(payloads[0])}\n  preflight:\n    stale_processes: false\n"
        + f"checkpoint:\n  dir: {q('/tmp/' + payloads[5])}\n"
        + f"code:\n  pythonpath: {q(payloads[2])}\n"
    )
    digest = build(mxc, str(spec))
    bundle = mxc_home / "bundles" / digest
    for script in ("entrypoint.sh", "job.sbatch", "env.sh"):
        subprocess.run(["bash", "-n", str(bundle / script)], check=True)
    # Sourcing env.sh gives back every value as the spec wrote it, byte for byte.
    shown = subprocess.run(
        ["bash", "-c",
         f"source {bundle}/env.sh && for i in 0 1 2 3 4 5; do v=EVIL_$i; printf '%s\\0' \"${{!v}}\"; done"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\0")[:-1]
    assert shown == templates
    # Running the entrypoint with a fake python that records its argv: payloads arrive intact.
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    argv_file = tmp_path / "argv.json"
    fake = fakebin / "fakepython"
    env_file = tmp_path / "env.json"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\njson.dump(sys.argv[1:], open({str(argv_file)!r}, 'a'))\n"
                    f"open({str(argv_file)!r}, 'a').write('\\n')\n"
                    f"json.dump({{k: v for k, v in os.environ.items() if k.startswith('EVIL_')}}, "
                    f"open({str(env_file)!r}, 'w'))\n")
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    result = subprocess.run(["bash", str(bundle / "entrypoint.sh")], capture_output=True, text=True,
                            env={**os.environ, "MXC_RUN_DIR": str(run_dir), "MXC_PYTHON": str(fake)})
    assert result.returncode == 0, result.stderr
    calls = [json.loads(line) for line in argv_file.read_text().splitlines()]
    train = next(c for c in calls if c[:2] == ["-m", "maxtext.trainers.pre_train.train"])
    for key, payload in zip(TEXT_KEYS, payloads, strict=True):
        assert f"{key}={payload}" in train
    assert json.loads(env_file.read_text()) == {f"EVIL_{i}": p for i, p in enumerate(payloads)}
    assert not marker.exists()
    # runtime.python itself is a payload: exec'd as a (missing) program name, never evaluated.
    result = subprocess.run(["bash", str(bundle / "entrypoint.sh")], capture_output=True, text=True,
                            env={**os.environ, "MXC_RUN_DIR": str(tmp_path / "run2")})
    assert result.returncode != 0
    assert not marker.exists()


def test_sbatch_directive_values_cannot_inject_lines(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """#SBATCH lines are parsed by sbatch, not a shell: quoting cannot help, so such values are validated."""
    copy_specs(tmp_path)
    for key, value in [("partition", "gpu\n#SBATCH --uid=0"), ("account", "a b"), ("sbatch_extra", ["--x\n--y"])]:
        spec = tmp_path / "evil.yaml"
        spec.write_text(f"extends: specs/70b.yaml\nresources:\n  {key}: {json.dumps(value)}\n")
        result = mxc("build", str(spec))
        assert result.returncode == 2, (key, result.stderr)
        assert f"evil.yaml:3: resources.{key}" in result.stderr
    assert store_snapshot(mxc_home) == []


def test_verify_names_the_changed_file(mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc, "specs/tiny.yaml")
    ok = mxc("verify", digest[:6])
    assert ok.returncode == 0 and ok.stdout.strip() == f"{digest[:12]}: ok"
    target = mxc_home / "bundles" / digest / "env.sh"
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[-2] ^= 0x01  # flip one bit of one byte
    target.write_bytes(bytes(data))
    bad = mxc("verify", digest[:6], "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)[digest]
    assert report == {"ok": False, "problems": ["env.sh: changed (sha256 differs from the manifest)"]}
    assert mxc("verify", "--all").returncode == 1


def test_hash_prefixes_unique_ambiguous_and_unknown(mxc: Mxc, mxc_home: Path) -> None:
    digests = [build(mxc, "specs/tiny.yaml", "--set", f"model.overrides.steps={n}") for n in range(1, 21)]
    first_chars = [d[0] for d in digests]
    shared = next(c for c in first_chars if first_chars.count(c) > 1)  # 20 hashes, 16 digits: always one
    ambiguous = mxc("show", shared)
    assert ambiguous.returncode == 2
    assert f"mxc: error: '{shared}' is ambiguous" in ambiguous.stderr and "give more digits" in ambiguous.stderr
    unique = mxc("show", digests[0][:10], "--json")
    assert unique.returncode == 0 and json.loads(unique.stdout)["hash"] == digests[0]
    unknown = mxc("show", "ffffffffffffffff0")
    assert unknown.returncode == 2 and "no bundle matches" in unknown.stderr
    assert mxc("show", "not-hex").returncode == 2
    listed = json.loads(mxc("ls", "--json").stdout)
    assert sorted(r["hash"] for r in listed) == sorted(digests)


def test_show_file_and_missing_file(mxc: Mxc) -> None:
    digest = build(mxc, "specs/70b.yaml")
    sbatch = mxc("show", digest[:8], "--file", "job.sbatch")
    assert sbatch.returncode == 0 and "#SBATCH --nodes=8" in sbatch.stdout
    missing = mxc("show", digest[:8], "--file", "nope")
    assert missing.returncode == 2 and "has no file 'nope'" in missing.stderr


def test_diff_specs_and_bundles(mxc: Mxc, tmp_path: Path) -> None:
    fp8 = tmp_path / "70b-fp8.yaml"
    copy_specs(tmp_path)
    fp8.write_text("extends: specs/70b.yaml\nmodel:\n  overrides:\n    quantization: fp8\n")
    result = mxc("diff", "specs/70b.yaml", str(fp8), "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["changes"] == [{"key": "model.overrides.quantization", "kind": "added", "new": "fp8"}]
    assert data["files"] == ["run.json", "spec.json"]  # the MaxText argv is in run.json; the shims never change
    a = build(mxc, "specs/tiny.yaml")
    b = build(mxc, "specs/tiny.yaml", "--set", "restart.max=5")
    text = mxc("diff", a[:8], b[:8])
    assert text.returncode == 1 and "~ restart.max: 2 -> 5" in text.stdout
    same = mxc("diff", "specs/tiny.yaml", a[:8])
    assert same.returncode == 0 and "no differences" in same.stdout


def test_schema_and_reference_doc_are_in_sync(mxc: Mxc) -> None:
    result = mxc("schema")
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False and "schema" in schema["required"]
    generated = subprocess.run([sys.executable, str(REPO / "tools" / "gen_spec_reference.py"), "--stdout"],
                               capture_output=True, text=True, check=True).stdout
    assert (REPO / "docs" / "spec-reference.md").read_text() == generated, "run tools/gen_spec_reference.py"


def test_cli_path_never_imports_heavy_modules(mxc_home: Path) -> None:
    probe = (
        "import sys, contextlib, io\n"
        "from mxc.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
        "    main(['build', 'specs/70b.yaml'])\n"
        "heavy = {'jax', 'jaxlib', 'ray', 'maxtext', 'tensorflow', 'torch'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """Every (sub)command path of the parser and its --help text, nested groups (mxc image build) included."""
    out: dict[tuple[str, ...], str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out[(*prefix, name)] = child.format_help()
                out.update(_commands(child, (*prefix, name)))
    return out


def test_every_command_help_ends_with_an_example() -> None:
    """Every command a user can type, present and future, shows a worked example in --help (not the
    hidden ones mxc runs itself on the other side of an ssh connection: remote-agent)."""
    from mxc.cli.main import HIDDEN_COMMANDS, build_parser

    commands = {path: text for path, text in _commands(build_parser()).items() if path[0] not in HIDDEN_COMMANDS}
    assert len(commands) >= 25, sorted(commands)
    missing = [" ".join(path) for path, text in commands.items() if "example:\n  mxc " not in text]
    assert missing == [], missing


def test_python_m_mxc_and_help_examples(mxc: Mxc) -> None:
    top = mxc("--help")
    assert top.returncode == 0 and "mxc build specs/tiny.yaml" in top.stdout
    for command in ("build", "ls", "show", "diff", "verify", "schema"):
        result = mxc(command, "--help")
        assert result.returncode == 0 and "example:" in result.stdout, command
