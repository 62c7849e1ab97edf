"""``mxc import maxtext-slurm``: MaxText-Slurm's own files (tests/fixtures/maxtext_slurm/, in its
formats, carrying six of its published configurations) become specs that build and check clean.

What "every setting" is does not come from the importer: bash itself sources the env files (with an
empty environment, as MaxText-Slurm's launcher does before training) and the exported variables and
XLA_FLAGS it ends with are compared with the built bundle's run.json. Whatever the importer leaves
out must be exactly what it reported, by file and line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mxc.importers import maxtext_slurm as ms
from tests.conftest import REPO, Mxc
from tests.registry_support import manifest_digest, push, registry

__all__ = ["registry"]  # the fixture, imported for the test below

FIXTURES = Path(__file__).parent / "fixtures" / "maxtext_slurm"
CONFIGS = sorted(p.name.removesuffix(".gpu.yml") for p in (FIXTURES / "configs").glob("*.gpu.yml"))
DIGEST = "sha256:" + "ab" * 32


def sourced(*files: Path) -> dict[str, str]:
    """What bash exports after sourcing ``files`` in an empty environment, less bash's own variables."""
    def env_after(script: str) -> dict[str, str]:
        out = subprocess.run(["env", "-i", "bash", "--noprofile", "--norc", "-c", script + "env -0"],
                             capture_output=True, check=True)
        return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)

    baseline = env_after("")
    after = env_after("".join(f"source {f}; " for f in files))
    return {k: v for k, v in after.items() if baseline.get(k) != v and k != "_"}


def flags_of(text: str) -> dict[str, str]:
    """XLA_FLAGS as XLA reads them: name -> value, one pair of quotes around a value stripped."""
    out = {}
    for word in text.split():
        name, _, value = word.removeprefix("--").partition("=")
        out[name] = value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value
    return out


def imported(mxc: Mxc, tmp_path: Path, model: str, *extra: str) -> tuple[Path, Any]:
    spec = tmp_path / "specs" / f"{model}.yaml"
    out = mxc("import", "maxtext-slurm", str(FIXTURES / "configs" / f"{model}.gpu.yml"),
              "--env", str(FIXTURES / "train_env.sh"), "-o", str(spec), "--digest", DIGEST, *extra, cwd=tmp_path)
    return spec, out


@pytest.mark.parametrize("model", CONFIGS)
def test_every_published_configuration_imports_builds_and_checks(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                 model: str) -> None:
    spec, out = imported(mxc, tmp_path, model)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(spec)
    config = FIXTURES / "configs" / f"{model}.gpu.yml"
    assert (spec.parent / config.name).read_bytes() == config.read_bytes()

    built = mxc("build", str(spec), "-q", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    bundle = mxc_home / "bundles" / built.stdout.strip().splitlines()[-1]
    assert (bundle / "model" / config.name).read_bytes() == config.read_bytes(), "the config file, verbatim"
    run: dict[str, Any] = json.loads((bundle / "run.json").read_text())
    assert run["code"]["from_image"] is True
    assert (run["train"]["module"], run["train"]["workdir"]) == ("MaxText.train", "/workspace/maxtext")
    assert run["train"]["config_file"] == f"model/{config.name}"
    assert run["train"]["steps"] == 15, "mxc follows the steps of the config file"
    assert run["container"]["image_digest"] == DIGEST

    # Every variable and XLA flag that sourcing the env files exports reaches the bundle, value for value,
    # or is one the importer reported as not imported.
    env_files = [FIXTURES / "train_env.sh"]
    model_env = FIXTURES / "configs" / f"{model}.env.sh"
    if model_env.exists():
        env_files.append(model_env)
    expected = sourced(*env_files)
    bundle_env = dict(run["env"])
    expected_flags = flags_of(expected.pop("XLA_FLAGS", ""))
    got_flags = flags_of(bundle_env.get("XLA_FLAGS", ""))
    report = spec.read_text()
    for name, value in expected.items():
        if name in ms.LAUNCHER_VARS:
            assert "a MaxText-Slurm launcher setting" in report and f"export {name}=" in report, name
            assert name not in bundle_env
            continue
        assert bundle_env.get(name) == value, (name, value, bundle_env.get(name))
    missing = {k: v for k, v in expected_flags.items() if got_flags.get(k) != v}
    if model == "deepseek3-671b":  # its env file picks this flag in a conditional: reported, by line
        assert missing == {"xla_gpu_all_gather_combine_threshold_bytes": "1073741824"}
        assert "deepseek3-671b.env.sh:10: if [[" in report and "#     a conditional block or function" in report
    else:
        assert missing == {}
    assert set(got_flags) == set(expected_flags) - set(missing)

    checked = mxc("check", str(spec), "--format", "json", cwd=tmp_path)
    findings = json.loads(checked.stdout)["findings"]
    assert [f for f in findings if f["severity"] == "error"] == [], findings
    # The config file's keys are judged by the image MaxText's catalog: grok-2's one key of its patch branch
    # is named, at its line in the copied file.
    unknown = [(f["key"], Path(f["file"]).name, f["line"]) for f in findings if f["rule"] == "maxtext-config-file-key"]
    assert unknown == ([("router_logits_soft_cap", "grok-2.gpu.yml", 21)] if model == "grok-2" else [])
    # The reference sets CUDA_DEVICE_MAX_CONNECTIONS on AMD on purpose: the import accepts that warning
    # (check.accept, with its reason), so the check passes; only grok-2's patch-branch key still warns.
    vendor = [f for f in findings if f["rule"] == "env-var-vendor"]
    assert vendor and all(f["severity"] == "note" and f["message"].startswith("accepted (") for f in vendor), vendor
    assert checked.returncode == (1 if model == "grok-2" else 0), checked.stdout


def test_nodes_steps_and_model_come_from_the_config(mxc: Mxc, tmp_path: Path) -> None:
    spec, out = imported(mxc, tmp_path, "mixtral-8x22b")
    assert out.returncode == 0, out.stderr
    text = spec.read_text()
    assert "  nodes: 4\n" in text, "dcn_fsdp_parallelism: 4 asks for four nodes"
    assert '  model_name: "mixtral-8x22b"\n' in text and "steps" not in text, "steps stay in the config file"
    spec, out = imported(mxc, tmp_path, "grok-2", "--nodes", "8", "--container", "apptainer", "--force")
    assert out.returncode == 0, out.stderr
    text = spec.read_text()
    assert '  model_name: "default"\n' in text and "  nodes: 8\n" in text and '  container: "apptainer"\n' in text
    assert "MAXTEXT_PATCH_BRANCH" in out.stderr and "code.repo + code.ref" in out.stderr


def test_without_a_digest_the_spec_is_left_to_mxc_lock(mxc: Mxc, tmp_path: Path) -> None:
    spec = tmp_path / "llama2-70b.yaml"
    out = mxc("import", "maxtext-slurm", str(FIXTURES / "configs" / "llama2-70b.gpu.yml"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert spec.is_file() and "digest:" not in spec.read_text().split("code:")[0].replace("# digest", "")
    assert f"mxc lock {spec.name} && mxc build --locked {spec.name}" in out.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["missing.gpu.yml"], "mxc: error: model config not found: missing.gpu.yml"),
    (["train_env.sh"], "expected a MaxText-Slurm model config"),
    (["configs/llama2-70b.gpu.yml", "--env", "nope.sh"], "mxc: error: env file not found: nope.sh"),
    (["configs/llama2-70b.gpu.yml", "-o", "out.txt"], "the spec is a YAML file"),
    (["configs/llama2-70b.gpu.yml", "--nodes", "0"], "--nodes 0: at least 1"),
    (["configs/llama2-70b.gpu.yml", "--digest", "sha256:12"], "image.digest"),
])
def test_bad_input_is_one_line_and_writes_nothing(mxc: Mxc, tmp_path: Path, args: list[str], expected: str) -> None:
    out_dir = tmp_path / "out"
    out = mxc("import", "maxtext-slurm", *args, "-o", str(out_dir / "x.yaml"), cwd=FIXTURES) if "-o" not in args \
        else mxc("import", "maxtext-slurm", *args, cwd=tmp_path if args[0] == "missing.gpu.yml" else FIXTURES)
    assert out.returncode == 2, out.stdout
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_existing_files_are_kept_without_force(mxc: Mxc, tmp_path: Path) -> None:
    spec = tmp_path / "specs" / "llama2-70b.yaml"
    spec.parent.mkdir()
    spec.write_text("mine\n")
    _, out = imported(mxc, tmp_path, "llama2-70b")
    assert out.returncode == 2 and "exists (pass --force to replace it)" in out.stderr
    assert spec.read_text() == "mine\n" and not (spec.parent / "llama2-70b.gpu.yml").exists()
    assert [p.name for p in spec.parent.iterdir()] == ["llama2-70b.yaml"], "no temporary directory left"


def test_a_broken_config_names_its_line(mxc: Mxc, tmp_path: Path) -> None:
    config = tmp_path / "bad.gpu.yml"
    config.write_text("base_config: base.yml\nsteps: [1\n")
    out = mxc("import", "maxtext-slurm", str(config), "-o", str(tmp_path / "out" / "bad.yaml"), cwd=tmp_path)
    assert out.returncode == 2 and "bad.gpu.yml:" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_help_has_an_example(mxc: Mxc) -> None:
    out = mxc("import", "maxtext-slurm", "--help")
    assert out.returncode == 0 and "example:\n  mxc import maxtext-slurm configs/llama2-70b.gpu.yml" in out.stdout


def test_env_shapes_the_importer_reads_and_those_it_reports() -> None:
    text = """#!/bin/bash
export A=1   # a comment
B='x y'
export B
export C="${C:-fallback}"
export D=$(hostname)
XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_one=1"
XLA_FLAGS="$XLA_FLAGS --xla_two='' \\
--xla_three=3"
XLA_FLAGS+=" --xla_four=4"
export XLA_FLAGS
if [[ -n "$X" ]]; then
    export INSIDE=1
    if true; then export DEEPER=1; fi
fi
: <<'OFF'
export HIDDEN=1
OFF
export AFTER=2
export MAXTEXT_PATCH_BRANCH=topic
"""
    env = ms.parse_env("t.sh", text)
    assert env.vars == {"A": "1", "B": "x y", "C": "fallback", "AFTER": "2"}
    assert env.xla_flags == {"xla_one": "1", "xla_two": "", "xla_three": "3", "xla_four": "4"}
    assert [(s.line, s.why.split(" (")[0]) for s in env.skipped] == [
        (6, "D's value is computed at run time"),
        (12, "a conditional block or function"),
        (16, "a heredoc block"),
        (20, "a MaxText-Slurm launcher setting"),
    ]


def test_an_imported_spec_is_locked_and_built_locked(mxc: Mxc, mxc_home: Path, registry: str, tmp_path: Path) -> None:
    """Without --digest, `mxc lock` resolves the image tag (a real registry here) and `mxc build --locked`
    builds the spec with its config file: the image's MaxText, pinned by the digest the lock found."""
    push(registry, "rocm/jax-training", "maxtext-v26.2", {"maxtext.txt": b"image MaxText"}, tmp_path)
    digest, _ = manifest_digest(registry, "rocm/jax-training", "maxtext-v26.2", "application/vnd.oci.image.manifest.v1+json")
    root = tmp_path / "proj"
    (root / "lockfiles").mkdir(parents=True)
    (root / ".git").mkdir()
    shutil.copyfile(REPO / "lockfiles" / "requirements-train.txt", root / "lockfiles" / "requirements-train.txt")
    out = mxc("import", "maxtext-slurm", str(FIXTURES / "configs" / "qwen3-30b-a3b.gpu.yml"), "--env",
              str(FIXTURES / "train_env.sh"), "--image", f"{registry}/rocm/jax-training:maxtext-v26.2",
              "-o", "specs/qwen3.yaml", cwd=root)
    assert out.returncode == 0, out.stderr
    assert "mxc lock specs/qwen3.yaml && mxc build --locked specs/qwen3.yaml" in out.stderr
    assert mxc("build", "specs/qwen3.yaml", cwd=root).returncode == 2, "not pinned until locked"
    locked = mxc("lock", "specs/qwen3.yaml", cwd=root)
    assert locked.returncode == 0, locked.stderr
    lock = json.loads((root / "lockfiles" / "qwen3.lock.json").read_text())
    assert lock["image"]["digest"] == digest and lock["code"] == {}, "no code to pin: it is the image's"
    assert "python" not in lock, "the image digest pins the Python environment"
    built = mxc("build", "--locked", "specs/qwen3.yaml", "-q", cwd=root)
    assert built.returncode == 0, built.stderr
    bundle = mxc_home / "bundles" / built.stdout.strip().splitlines()[-1]
    run = json.loads((bundle / "run.json").read_text())
    assert run["container"]["image_digest"] == digest and run["code"]["from_image"] is True
    assert (bundle / "model" / "qwen3-30b-a3b.gpu.yml").read_bytes() == \
        (FIXTURES / "configs" / "qwen3-30b-a3b.gpu.yml").read_bytes()


def test_nothing_in_an_env_file_or_a_path_can_add_keys_through_the_report(mxc: Mxc, tmp_path: Path) -> None:
    """Lines left out are quoted in comments: a path or line holding a YAML line break stays inside its comment."""
    weird = tmp_path / "env\u2028name: evil.sh"
    weird.write_text("export A=$(x)\u0085schema: nope\n")
    spec = tmp_path / "out" / "llama2-70b.yaml"
    out = mxc("import", "maxtext-slurm", str(FIXTURES / "configs" / "llama2-70b.gpu.yml"), "--env", str(weird),
              "-o", str(spec), "--digest", DIGEST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = spec.read_text()
    assert "\u2028" not in text and "\x85" not in text and "\\u2028name: evil.sh" in text
    assert [line for line in text.splitlines() if line.startswith(("name:", "schema:"))] == \
        ["schema: mxc/v1", 'name: "llama2-70b"']
