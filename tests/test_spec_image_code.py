"""Code from the image and the model config as a file (issue 15): what MaxText-Slurm runs, expressed
in a spec. A spec takes the image's own MaxText (``code.from_image``, pinned by ``image.digest``),
starts it the way ROCm's images need (``code.entry``), and hands it a MaxText YAML beside the spec
(``model.config_file``), which the bundle carries and hashes.

Built bundles are read back (run.json, the copied file, the manifest); a local run through a stand-in
``podman`` (tests/standins/trainer.py as the container's python) shows the exact command line the
node program starts and that the trainer read the very bytes of the config file.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from mxc.node import container
from mxc.node.contract import Container
from tests.conftest import REPO, Mxc

FIXTURES = REPO / "tests" / "fixtures" / "maxtext_slurm" / "configs"
STANDIN = REPO / "tests" / "standins" / "trainer.py"
DIGEST = "sha256:" + "ab" * 32

SPEC = f"""\
schema: mxc/v1
name: llama2-70b
image:
  ref: docker.io/rocm/jax-training:maxtext-v26.2
  digest: {DIGEST}
code:
  from_image: true
  entry:
    module: MaxText.train
    workdir: /workspace/maxtext
model:
  model_name: llama2-70b
  config_file: configs/llama2-70b.gpu.yml
  overrides:
    steps: 20
resources: {{nodes: 2, gpus_per_node: 8, gpu_vendor: amd}}
runtime: {{backend: slurm, container: podman}}
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """specs/llama2-70b.yaml naming ../configs/llama2-70b.gpu.yml, both inside one repository."""
    (tmp_path / ".git").mkdir()  # the repository root (mxc/specfiles.py looks for .git)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "llama2-70b.gpu.yml").write_bytes((FIXTURES / "llama2-70b.gpu.yml").read_bytes())
    path = tmp_path / "specs" / "llama2-70b.yaml"
    path.parent.mkdir()
    path.write_text(SPEC.replace("config_file: configs/", "config_file: ../configs/"))
    return path


def build(mxc: Mxc, mxc_home: Path, spec: Path, *sets: str) -> Path:
    out = mxc("build", str(spec), "-q", *[a for s in sets for a in ("--set", s)], cwd=spec.parent)
    assert out.returncode == 0, out.stderr
    return mxc_home / "bundles" / out.stdout.strip().splitlines()[-1]


def contract(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((bundle / "run.json").read_text())
    return data


def test_image_code_and_config_file_reach_the_bundle(mxc: Mxc, mxc_home: Path, spec: Path, tmp_path: Path) -> None:
    bundle = build(mxc, mxc_home, spec)
    run = contract(bundle)
    assert run["code"] == {"repo": None, "commit": None, "maxtext_version": None, "from_image": True}
    train = run["train"]
    assert (train["module"], train["workdir"]) == ("MaxText.train", "/workspace/maxtext")
    assert "script" not in train, "a field at its default is left out of run.json (typed.to_compact_dict)"
    assert train["config_file"] == "model/llama2-70b.gpu.yml"
    # The config file is the first argument (placed by the node program); no configs-directory path is passed.
    assert train["args"] == ["model_name=llama2-70b", "steps=20", "enable_checkpointing=false"]
    copied = bundle / "model" / "llama2-70b.gpu.yml"
    assert copied.read_bytes() == (FIXTURES / "llama2-70b.gpu.yml").read_bytes()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert "model/llama2-70b.gpu.yml" in manifest["files"]
    saved = json.loads((bundle / "spec.json").read_text())
    assert saved["code"]["from_image"] is True and saved["model"]["config_file"] == "../configs/llama2-70b.gpu.yml"
    # One changed byte inside the config file is another bundle.
    config = tmp_path / "configs" / "llama2-70b.gpu.yml"
    config.write_text(config.read_text().replace("per_device_batch_size: 8", "per_device_batch_size: 7"))
    again = build(mxc, mxc_home, spec)
    assert again != bundle and "per_device_batch_size: 7" in (again / "model" / "llama2-70b.gpu.yml").read_text()


def test_the_entry_can_be_a_script_and_a_configs_directory(mxc: Mxc, mxc_home: Path, spec: Path) -> None:
    bundle = build(mxc, mxc_home, spec, "code.entry.module=null", "code.entry.script=MaxText/train.py",
                   "model.config_file=null", "model.config=models/llama2-70b.yml", "code.entry.configs=MaxText/configs")
    train = contract(bundle)["train"]
    assert train["script"] == "MaxText/train.py" and "config_file" not in train
    assert train["args"][0] == "MaxText/configs/models/llama2-70b.yml"


def test_specs_without_the_new_fields_keep_their_spec_json(mxc: Mxc, mxc_home: Path) -> None:
    """The upstream entry and git code stay out of spec.json, so existing bundle hashes do not move."""
    bundle = build(mxc, mxc_home, REPO / "specs" / "tiny.yaml")
    saved = json.loads((bundle / "spec.json").read_text())
    assert "from_image" not in saved["code"] and "entry" not in saved["code"]
    assert "config_file" not in saved["model"]
    run = contract(bundle)
    train = run["train"]
    assert train["module"] == "maxtext.trainers.pre_train.train" and train["args"][0] == "src/maxtext/configs/base.yml"
    assert not {"script", "config_file", "workdir"} & set(train) and "from_image" not in run["code"]


@pytest.mark.parametrize(("sets", "expected"), [
    (("runtime.container=native", "image=null"), "code.from_image: runtime.container is native"),
    (("code.repo=https://example.com/maxtext.git",), "code.repo: code.from_image runs the image's MaxText"),
    (("code.maxtext_version=0.2.5",), "code.maxtext_version: code.from_image runs the image's MaxText"),
    (("code.from_image=false",), "pin the training code with code.repo + code.commit, code.maxtext_version, "
                                 "or (containers) code.from_image: true"),
    (("code.from_image=false", "code.repo=/x", "code.commit=" + "a" * 40),
     "code.entry.workdir: only with code.from_image"),
    (("runtime.container=apptainer", "code.entry.workdir=null"), "code.entry.workdir: apptainer starts in the host's"),
    (("code.entry.script=MaxText/train.py",), "code.entry.script: name either code.entry.module or code.entry.script"),
    (("code.entry.module=null", "code.entry.script=MaxText/train"), "code.entry.script: a Python script ending in .py"),
    (("code.entry.configs=a/../../b",), "code.entry.configs: a path inside the working directory, without '..'"),
    (("model.config=base.yml",), "model.config_file: name either model.config"),
    (("model.config_file=missing.yml",), "model.config_file: file not found"),
    (("model.config_file=/etc/hosts.yml",), "model.config_file: does not match"),
    (("model.config_file=../../../../etc/x.yml",), "model.config_file: ../../../../etc/x.yml: outside the spec's repository"),
    (("model.config_file=../configs/other.yaml",), "model.config_file: does not match"),
    (("model.model_name=llama2-7b",), "sets model_name 'llama2-70b' but model.model_name is 'llama2-7b'"),
])
def test_nonsense_combinations_are_one_clear_error(mxc: Mxc, mxc_home: Path, spec: Path,
                                                    sets: tuple[str, ...], expected: str) -> None:
    out = mxc("build", str(spec), *[a for s in sets for a in ("--set", s)], cwd=spec.parent)
    assert out.returncode == 2, out.stdout
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (mxc_home / "bundles").exists() or not any((mxc_home / "bundles").iterdir())


def test_a_config_file_that_is_not_a_mapping_names_its_own_line(mxc: Mxc, spec: Path, tmp_path: Path) -> None:
    (tmp_path / "configs" / "llama2-70b.gpu.yml").write_text("base_config: base.yml\n- a list item\n")
    out = mxc("build", str(spec), cwd=spec.parent)
    assert out.returncode == 2 and "llama2-70b.gpu.yml:2" in out.stderr, out.stderr


def test_diff_shows_keys_changed_inside_the_config_file(mxc: Mxc, mxc_home: Path, spec: Path, tmp_path: Path) -> None:
    before = build(mxc, mxc_home, spec).name
    config = tmp_path / "configs" / "llama2-70b.gpu.yml"
    config.write_text(config.read_text().replace("max_target_length: 4096", "max_target_length: 8192")
                      + "expert_balance: true\n")
    out = mxc("diff", before, str(spec), cwd=spec.parent)
    assert out.returncode == 1, out.stderr
    assert "~ model.config_file.content.max_target_length: 4096 -> 8192" in out.stdout
    assert "+ model.config_file.content.expert_balance: True" in out.stdout
    assert "bundle files that differ: model/llama2-70b.gpu.yml" in out.stdout


def _prefix(c: Container, image: str, code_dir: str | None, workdir: str | None) -> list[str]:
    return container.launcher(c, "python3", container.Image(image, "exists"), {}, Path("/r"), Path("/o"), code_dir, [],
                              {}, None, Path("/n"), Path("/r/req.json"), workdir=workdir).prefix


def test_podman_and_apptainer_start_in_the_images_maxtext() -> None:
    shim = ["python3", "/n/envmerge.py", "/r/req.json", "--", "python3"]  # joins the image's environment first
    c = Container(kind="podman", image_ref="img", image_digest=DIGEST, gpu_vendor="none", mounts=[], python="python3",
                  maxtext_version=None)
    podman = _prefix(c, "img@" + DIGEST, None, "/workspace/maxtext")
    assert podman[-8:] == ["--workdir", "/workspace/maxtext", "img@" + DIGEST, *shim]
    c = Container(kind="apptainer", image_ref="img", image_digest=DIGEST, gpu_vendor="amd", mounts=[], python="python3",
                  maxtext_version=None)
    apptainer = _prefix(c, "/c/img.sif", None, "/workspace/maxtext")
    assert apptainer[-8:] == ["--pwd", "/workspace/maxtext", "/c/img.sif", *shim]
    # A pinned checkout stays the working directory.
    pinned = _prefix(c, "/c/img.sif", "/code", None)
    assert "--pwd" in pinned and pinned[pinned.index("--pwd") + 1] == "/code"


def test_a_local_podman_run_starts_the_images_maxtext_with_the_config_file(
        mxc: Mxc, mxc_home: Path, spec: Path, tmp_path: Path) -> None:
    """The command line the node program starts, recorded by a stand-in podman that then runs the stand-in
    trainer as the container's python3 (after copying the config argument it was given)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = run ]; then\n'
        '  printf "%s\\n" "$@" > "$MXC_RUN_DIR/podman.argv"\n'
        '  while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done; shift 4\n'  # past envmerge.py: python3 -m X
        '  cp "$1" "$MXC_RUN_DIR/trainer-config.yml"\n'
        f'  exec {sys.executable} {STANDIN} "$@"\n'
        "fi\n"
        "exit 0\n")
    podman.chmod(0o755)
    bundle = build(mxc, mxc_home, spec, "resources.nodes=1", "resources.gpus_per_node=0", "resources.gpu_vendor=none",
                   "runtime.backend=local", "runtime.preflight.stale_processes=false")
    out = mxc("run", bundle.name, "--yes", env={"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    run = mxc_home / "runs" / out.stdout.strip().splitlines()[-1]
    argv = (run / "podman.argv").read_text().splitlines()
    ref = f"docker.io/rocm/jax-training:maxtext-v26.2@{DIGEST}"
    at = argv.index(ref)
    assert argv[at - 2:at] == ["--workdir", "/workspace/maxtext"]
    config = str(run / "model" / "llama2-70b.gpu.yml")
    assert argv[at + 1] == "python3" and argv[at + 2].endswith("/mxc_node/envmerge.py")
    dashes = argv.index("--", at)
    assert argv[dashes + 1:dashes + 6] == ["python3", "-m", "MaxText.train", config, "model_name=llama2-70b"]
    assert ["--volume", f"{run}:{run}"] in [list(pair) for pair in itertools.pairwise(argv)]
    assert (run / "trainer-config.yml").read_bytes() == (FIXTURES / "llama2-70b.gpu.yml").read_bytes()
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "succeeded"
    assert record["code"] == {"source": "image", "image_ref": "docker.io/rocm/jax-training:maxtext-v26.2",
                              "image_digest": DIGEST, "entry": "MaxText.train"}


def test_check_reports_a_config_file_that_would_stop_the_build(mxc: Mxc, spec: Path, tmp_path: Path) -> None:
    (tmp_path / "configs" / "llama2-70b.gpu.yml").unlink()
    out = mxc("check", str(spec), "--format", "json", cwd=spec.parent)
    assert out.returncode == 1, out.stderr
    [finding] = [f for f in json.loads(out.stdout)["findings"] if f["severity"] == "error"]
    assert (finding["key"], finding["line"], finding["rule"]) == ("model.config_file", 13, "schema")
    assert finding["message"].startswith("file not found:") and finding["message"].endswith("llama2-70b.gpu.yml")


def test_steps_and_hardware_in_the_config_file_count_as_set(mxc: Mxc, mxc_home: Path, spec: Path) -> None:
    """Without a steps override mxc follows the file's steps (15); its hardware stays the file's (no
    hardware=gpu added); an override still wins."""
    run = contract(build(mxc, mxc_home, spec, "model.overrides.steps=null"))
    assert run["train"]["steps"] == 15 and run["restart"]["final_step"] == 14
    assert run["train"]["distributed_args"] == ["skip_jax_distributed_system=false"]
    assert contract(build(mxc, mxc_home, spec))["train"]["steps"] == 20


def test_checkpointing_in_the_config_file_needs_checkpoint_period(mxc: Mxc, spec: Path, tmp_path: Path) -> None:
    config = tmp_path / "configs" / "llama2-70b.gpu.yml"
    config.write_text(config.read_text().replace("enable_checkpointing: False", "enable_checkpointing: True\n"
                                                 "checkpoint_period: 50"))
    out = mxc("build", str(spec), cwd=spec.parent)
    assert out.returncode == 2 and "sets enable_checkpointing: true but checkpoint.period is 0" in out.stderr
    assert "(set checkpoint.period: 50)" in out.stderr
    assert mxc("build", str(spec), "--set", "checkpoint.period=50", cwd=spec.parent).returncode == 0


def test_the_probe_keeps_every_argument_with_a_config_file() -> None:
    """`mxc check --probe` runs MaxText's argv without the config path: with a config file there is none
    to drop, so model_name and the overrides all stay."""
    import yaml

    from mxc.compiler.check.probe_plan import maxtext_case
    from mxc.compiler.schema import JobSpec

    spec = JobSpec.model_validate(yaml.safe_load(SPEC))
    _, argv, devices = maxtext_case(spec)
    assert argv[:3] == ("model_name=llama2-70b", "steps=20", "enable_checkpointing=false") and devices == 16


def test_the_confirmation_names_the_image_as_the_code(mxc: Mxc, mxc_home: Path, spec: Path) -> None:
    from mxc.cli import confirm
    from mxc.node import contract as node_contract

    run = node_contract.parse((build(mxc, mxc_home, spec) / "run.json").read_text())
    assert confirm._code(run) == f"the image's MaxText (docker.io/rocm/jax-training:maxtext-v26.2@{DIGEST[:19]})"
