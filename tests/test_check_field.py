"""`mxc check` knows the field: AMD's production settings (MaxText-Slurm's train_env.sh and model
configs, as fixtures in its own formats under tests/fixtures/maxtext_slurm/) check clean on ROCm,
real conflicts stay errors, and the catalogs of the images' jaxlib and MaxText are the ones used.
The MaxText catalog generator is run here on real trees: a git commit, a directory, the installed
maxtext (whose ast reading must equal the import reading).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.compiler.check.catalogs import (
    env_catalog,
    maxtext_catalog,
    maxtext_catalog_names,
    xla_catalog,
    xla_catalog_versions,
    xla_index,
)
from mxc.compiler.check.findings import Finding
from mxc.compiler.check.matrix import expand, parse_matrix
from mxc.compiler.check.runner import Lock, _base, check_combination
from mxc.compiler.check.subject import choose_jaxlib, choose_maxtext, image_name
from mxc.compiler.loader import load_yaml
from mxc.compiler.schema import RESERVED_OVERRIDES, JobSpec
from tests.check_support import check, line_of, of_rule
from tests.conftest import Mxc

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "maxtext_slurm"
GEN = REPO / "tools" / "gen_maxtext_catalog.py"
AMD_MAXTEXT = "maxtext-pr2879-f37ef2b8547b"
MODELS = ("llama2-70b", "mixtral-8x22b", "llama3.1-405b")

_EXPORT = re.compile(r"^\s*export\s+([A-Z][A-Z0-9_]*)=(.*)$")
_APPEND = re.compile(r'^\s*XLA_FLAGS="(?:\$\{XLA_FLAGS:\+\$XLA_FLAGS \}|\$XLA_FLAGS )(--[^"]+)"\s*$')
_DEFAULT = re.compile(r"^\$\{[A-Z0-9_]+:-(.*)\}$")


def read_train_env(path: Path) -> tuple[dict[str, str], dict[str, str | bool]]:
    """(variables, XLA flags) of a train_env.sh: ``export NAME=value`` lines (``${NAME:-d}`` gives d)
    and ``XLA_FLAGS`` appends (a bare ``--flag`` is true), with shell quotes removed as bash would."""
    variables: dict[str, str] = {}
    flags: dict[str, str | bool] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := _APPEND.match(line):
            name, eq, value = m.group(1)[2:].partition("=")
            flags[name] = value.replace("${OUTPUT_PATH}", "/outputs/run").strip("'") if eq else True
        elif (m := _EXPORT.match(line)) and m.group(1) != "XLA_FLAGS":
            value = m.group(2).strip().strip('"')
            default = _DEFAULT.match(value)
            variables[m.group(1)] = default.group(1) if default else value
    return variables, flags


def read_gpu_yml(model: str) -> tuple[str, dict[str, Any]]:
    """model_name and the MaxText overrides of configs/<model>.gpu.yml (mxc sets run_name itself)."""
    config = yaml.safe_load((FIXTURES / "configs" / f"{model}.gpu.yml").read_text(encoding="utf-8"))
    name = config.pop("model_name")
    config.pop("base_config")
    return name, {k: v for k, v in config.items() if k not in RESERVED_OVERRIDES}


def rocm_spec(model: str, image: str = "docker.io/rocm/jax-training:maxtext-v26.2", nodes: int = 4,
              env_file: str = "train_env.sh") -> dict[str, Any]:
    """A ROCm spec carrying the fixtures' settings, as `mxc import maxtext-slurm` will write it."""
    variables, flags = read_train_env(FIXTURES / env_file)
    model_name, overrides = read_gpu_yml(model)
    return {
        "schema": "mxc/v1",
        "name": f"{model}-mi355x",
        "image": {"ref": image, "digest": "sha256:" + "c" * 64},
        "code": {"repo": "https://github.com/ROCm/maxtext", "commit": "d" * 40, "maxtext_catalog": AMD_MAXTEXT},
        "model": {"model_name": model_name, "overrides": overrides},
        "env": {"xla_flags": flags, "vars": variables},
        "resources": {"nodes": nodes, "gpus_per_node": 8, "gpu_vendor": "amd", "constraint": "mi355x", "time": "02:00:00"},
        "runtime": {"backend": "slurm", "container": "podman"},
    }


def failing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.fails]


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


# ---------------------------------------------------------------- AMD's settings check clean on ROCm

@pytest.mark.parametrize("model", MODELS)
def test_amd_production_settings_have_no_error_on_rocm(model: str) -> None:
    findings, text = check(rocm_spec(model))
    assert errors(findings) == [], findings
    # The one warning is justified: HIP never reads CUDA_DEVICE_MAX_CONNECTIONS (AMD sets it anyway).
    (warning,) = failing(findings)
    assert warning.rule == "env-var-vendor" and warning.severity == "warning"
    assert warning.key == "env.vars.CUDA_DEVICE_MAX_CONNECTIONS" and "harmless" in warning.message
    assert warning.line == line_of(text, "CUDA_DEVICE_MAX_CONNECTIONS")
    notes = {f.rule: f for f in findings if f.severity == "note"}
    assert "NCCL_CHECKS_DISABLE does nothing" in notes["env-var-deprecated"].message


def test_the_cli_checks_the_three_configurations_with_no_error(mxc: Mxc, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    for model in MODELS:
        (specs / f"{model}.yaml").write_text(yaml.safe_dump(rocm_spec(model), sort_keys=False))
    out = mxc("check", "specs", "--json", cwd=tmp_path)
    report = json.loads(out.stdout)
    assert report["summary"]["specs"] == 3 and report["summary"]["error"] == 0, out.stdout
    # Exit 1: warnings fail a check; the three are CUDA_DEVICE_MAX_CONNECTIONS, one per spec.
    assert out.returncode == 1 and report["summary"]["warning"] == 3
    assert {(f["rule"], f["key"]) for f in report["findings"] if f["severity"] == "warning"} == {
        ("env-var-vendor", "env.vars.CUDA_DEVICE_MAX_CONNECTIONS")}


def test_every_setting_of_the_fixtures_is_catalogued() -> None:
    cat = env_catalog()
    for env_file in ("train_env.sh", "train_env.tuning.sh"):
        variables, flags = read_train_env(FIXTURES / env_file)
        assert len(variables) >= 20 and flags
        assert not [n for n in variables if n not in cat.variables], env_file
        for version in ("0.8.2", "0.11.0", "0.11.1"):
            assert set(flags) <= set(xla_catalog(version).flags), (env_file, version)
    # The eleven "unknown" variables of issue 15 are now known, with their source.
    for name in ("NCCL_CHECKS_DISABLE", "NCCL_NCHANNELS_PER_NET_PEER", "HSA_ENABLE_IPC_MODE_LEGACY", "NVTE_USE_HIPBLASLT",
                 "NVTE_USE_ROCM", "NCCL_IB_USE_INLINE", "NVTE_USE_CAST_TRANSPOSE_TRITON", "NCCL_GDRCOPY_ENABLE",
                 "NCCL_GDR_FLUSH_DISABLE", "NCCL_IB_ECE_ENABLE", "RCCL_GDR_FLUSH_GPU_MEM_NO_RELAXED_ORDERING"):
        assert cat.variables[name].source.startswith("https://"), name


def test_the_published_tuning_options_have_no_error() -> None:
    data = rocm_spec("llama2-70b", env_file="train_env.tuning.sh")
    findings, _ = check(data)
    assert errors(findings) == [] and failing(findings) == [], findings


def test_the_settings_as_one_raw_xla_flags_string_also_check_clean() -> None:
    # What train_env.sh exports is one XLA_FLAGS string, shell quotes included ('' and '(?i)gpu').
    data = rocm_spec("mixtral-8x22b")
    raw = (FIXTURES / "train_env.sh").read_text(encoding="utf-8")
    tokens = re.findall(r"(--xla_[a-z0-9_]+=?[^\"\s]*)", raw)
    data["env"]["xla_flags"] = {}
    data["env"]["vars"]["XLA_FLAGS"] = " ".join(t.replace("${OUTPUT_PATH}", "/outputs/run") for t in tokens)
    findings, _ = check(data)
    assert errors(findings) == [], findings


def test_a_real_typo_in_amds_commented_options_is_caught() -> None:
    # train_env.sh keeps '#export NCCL_IB_QPS=2': NCCL has no such variable, it would be ignored.
    data = rocm_spec("llama2-70b")
    data["env"]["vars"]["NCCL_IB_QPS"] = "2"
    (f,) = of_rule(check(data)[0], "env-var-unknown")
    assert f.key == "env.vars.NCCL_IB_QPS" and f.suggestion == "did you mean 'NCCL_IB_QPS_PER_CONNECTION'?"


# ---------------------------------------------------------------- real conflicts stay errors

@pytest.mark.parametrize(("name", "value", "words"), [
    ("NVTE_FUSED_ATTN_BACKEND", "1", "CK or AOTriton"),  # a cuDNN backend number on ROCm
    ("JAX_PLATFORMS", "cuda", "use rocm"),
    ("NCCL_IB_TIMEOUT", "40", "outside 1..31"),
    ("NCCL_SOCKET_NTHREADS", "32", "outside 1..16"),
])
def test_real_conflicts_in_the_same_settings_are_errors(name: str, value: str, words: str) -> None:
    data = rocm_spec("llama2-70b")
    data["env"]["vars"][name] = value
    bad = [f for f in errors(check(data)[0]) if f.key == f"env.vars.{name}"]
    assert bad and words in bad[0].message + bad[0].suggestion, bad


def test_the_same_settings_on_nvidia_gpus_warn_and_a_gpu_selection_is_an_error() -> None:
    data = rocm_spec("llama2-70b")
    data["resources"].update(gpu_vendor="nvidia", constraint="h100")
    data["env"]["vars"].pop("NVTE_FUSED_ATTN_CK")
    data["code"]["maxtext_catalog"] = AMD_MAXTEXT
    findings, _ = check(data)
    vendor = of_rule(findings, "env-var-vendor")
    # ROCm-only tuning does nothing on NVIDIA: warnings, each with its reason.
    assert len(vendor) >= 15 and {f.severity for f in vendor} == {"warning"}
    assert all("harmless" in f.message for f in vendor)
    data["env"]["vars"]["ROCR_VISIBLE_DEVICES"] = "0,1,2,3"
    (conflict,) = [f for f in of_rule(check(data)[0], "env-var-vendor") if f.severity == "error"]
    assert conflict.key == "env.vars.ROCR_VISIBLE_DEVICES" and "CUDA_VISIBLE_DEVICES" in conflict.message


# ---------------------------------------------------------------- the catalogs of the images are used

def _pins(data: dict[str, Any]) -> tuple[str | None, str | None]:
    job = JobSpec.model_validate(data)
    return choose_jaxlib(job, None).version, choose_maxtext(job).version


@pytest.mark.parametrize(("tag", "jaxlib", "only_there", "gone"), [
    ("maxtext-v26.2", "0.8.2", "xla_gpu_enable_split_k_autotuning", "xla_dump_hlo_to_subfolder"),
    ("maxtext-v26.6", "0.11.0", "xla_gpu_fused_attention_use_cudnn_rng", "xla_gpu_enable_split_k_autotuning"),
    ("maxtext-v26.8", "0.11.1", "xla_gpu_allow_ragged_all_to_all_nccl_send_recv_fallback",
     "xla_gpu_fused_attention_use_cudnn_rng"),
])
def test_the_images_jaxlib_catalog_judges_the_flags(tag: str, jaxlib: str, only_there: str, gone: str) -> None:
    data = rocm_spec("llama2-70b", image=f"docker.io/rocm/jax-training:{tag}")
    assert _pins(data) == (jaxlib, AMD_MAXTEXT)
    data["env"]["xla_flags"][only_there] = True
    findings, _ = check(data)
    assert errors(findings) == [], findings
    data["env"]["xla_flags"][gone] = True
    (f,) = of_rule(check(data)[0], "xla-flag-version")
    assert f.key == f"env.xla_flags.{gone}" and f"jaxlib {jaxlib}" in f.message


def test_a_sweep_over_images_rechecks_the_flags_with_each_images_jaxlib() -> None:
    # The matrix fast path reuses a rule's result when the sections it reads did not change;
    # the XLA rules read `image` too now (the image decides the catalog).
    data = rocm_spec("llama2-70b")
    data["env"]["xla_flags"]["xla_gpu_enable_split_k_autotuning"] = True  # in 0.8.2, gone by 0.11.0
    doc = load_yaml("spec.yaml", yaml.safe_dump(data, sort_keys=False))
    images = "[docker.io/rocm/jax-training:maxtext-v26.2, docker.io/rocm/jax-training:maxtext-v26.6]"
    sweep = parse_matrix(load_yaml("sweep.yaml", f"matrix: mxc/v1\naxes:\n  image.ref: {images}\n"), "sweep.yaml")
    base = _base(doc, "spec.yaml", Lock())
    found = []
    for combo in expand(sweep):
        fast = check_combination(doc, "spec.yaml", combo, base=base)
        full = check_combination(doc, "spec.yaml", combo)
        assert sorted(map(str, fast.findings)) == sorted(map(str, full.findings)), combo.label()
        found.append(sorted(f.rule for f in errors(fast.findings)))
    assert found == [[], ["xla-flag-version"]]


def test_a_pinned_jaxlib_wins_and_a_local_build_uses_its_release_with_a_note() -> None:
    data = rocm_spec("llama2-70b")
    data["code"]["jaxlib_version"] = "0.11.1"
    assert _pins(data)[0] == "0.11.1"
    data["code"]["jaxlib_version"] = "0.8.2+selfbuilt"
    assert _pins(data)[0] == "0.8.2"
    findings, text = check(data)
    (note,) = of_rule(findings, "jaxlib-catalog")
    assert note.severity == "note" and "0.8.2+selfbuilt" in note.message and "jaxlib 0.8.2's catalog" in note.message
    assert note.line == line_of(text, "jaxlib_version") and errors(findings) == []
    data["code"]["jaxlib_version"] = "0.9.9+rocm"
    (missing,) = of_rule(check(data)[0], "jaxlib-catalog")
    assert missing.severity == "error" and "no XLA flag catalog for jaxlib 0.9.9+rocm" in missing.message


def test_unknown_images_keep_the_default_catalog() -> None:
    data = rocm_spec("llama2-70b", image="registry.example.com/me/jax:latest")
    assert _pins(data)[0] == xla_index()["default"]
    assert image_name("docker.io/library/ubuntu:24.04@sha256:" + "0" * 64) == "ubuntu:24.04"


def test_the_maxtext_catalog_is_named_or_derived_from_the_pinned_commit() -> None:
    data = rocm_spec("mixtral-8x22b")
    assert _pins(data)[1] == AMD_MAXTEXT
    # Without it, PyPI maxtext's catalog refuses AMD's key and says which catalog has it.
    del data["code"]["maxtext_catalog"]
    assert _pins(data)[1] == "maxtext-0.2.5"
    (f,) = of_rule(check(data)[0], "maxtext-override-unknown")
    assert f.key == "model.overrides.expert_balance" and AMD_MAXTEXT in f.suggestion
    # A spec pinned to the commit a catalog was generated from gets that catalog.
    source = maxtext_catalog(AMD_MAXTEXT).source
    data["code"].update(repo="git@github.com:AI-Hypercomputer/maxtext.git", commit=source["commit"])
    assert _pins(data)[1] == AMD_MAXTEXT
    findings, _ = check(data)
    assert not of_rule(findings, "maxtext-override-unknown") and errors(findings) == [], findings


def test_shipped_catalogs_name_their_source() -> None:
    assert {"0.8.2", "0.11.0", "0.11.1"} <= set(xla_catalog_versions())
    for ref, entry in xla_index()["images"].items():
        assert entry["jaxlib"] in xla_catalog_versions() and entry["source"].startswith("https://"), ref
    assert {"maxtext-0.2.5", AMD_MAXTEXT, "rocm-maxtext-7629ac5ab390"} <= set(maxtext_catalog_names())
    data = resources.files("mxc.compiler").joinpath("data", "maxtext")
    for name in maxtext_catalog_names():
        raw = json.loads(data.joinpath(f"{name}.json").read_text("utf-8"))
        assert raw["name"] == name and raw["source"]["kind"] in ("package", "git", "directory"), name
        assert raw["models"] and len(raw["keys"]) > 200, name
    amd = maxtext_catalog(AMD_MAXTEXT)
    assert amd.keys["expert_balance"].type == "bool" and amd.source["layout"] == "src/MaxText/configs"
    assert {"llama2-70b", "mixtral-8x22b", "llama3.1-405b"} <= set(amd.models)
    old = maxtext_catalog("rocm-maxtext-7629ac5ab390")  # the older MaxText/ layout: keys of base.yml
    assert old.source["layout"] == "MaxText/configs" and old.keys["per_device_batch_size"].type == "number"


# ---------------------------------------------------------------- the generator on real trees

def run_gen(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(GEN), *args], capture_output=True, text=True, env=env, timeout=300)


def test_ast_reading_equals_importing_on_the_installed_maxtext(tmp_path: Path) -> None:
    found = importlib.util.find_spec("maxtext")
    assert found is not None and found.origin is not None
    package = Path(found.origin).resolve().parent
    proc = run_gen("--dir", str(package), "--name", "by-ast", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    by_ast = json.loads((tmp_path / "by-ast.json").read_text())
    shipped = maxtext_catalog("0.2.5")  # generated by importing maxtext.configs.types
    assert set(by_ast["keys"]) == set(shipped.keys)
    for name, key in shipped.keys.items():
        got = by_ast["keys"][name]
        assert (got["type"], got["optional"], tuple(got.get("choices", ())), got.get("default")) == (
            key.type, key.optional, key.choices, key.default), name
    assert {n: {k: v for k, v in m.items()} for n, m in by_ast["models"].items()} == shipped.models
    assert by_ast["source"]["layout"] == "configs" and "read with ast" in by_ast["method"]


TYPES_PY = '''
from enum import Enum
from typing import Literal, Optional
from pydantic import BaseModel, Field
from pydantic.types import NonNegativeInt
from MaxText.common_types import DecoderBlockType

PathStr = str
type ModelName = Literal["default", "tiny-moe"]

class Precision(str, Enum):
  DEFAULT = "default"
  HIGH = "high"

class Run(BaseModel):
  model_name: ModelName = Field("default")
  steps: NonNegativeInt = Field(10)
  base_output_directory: PathStr = Field("")

class Moe(BaseModel):
  expert_balance: bool = Field(False)
  capacity_factor: float = Field(-1.0)
  matmul_precision: Precision = Field(Precision.DEFAULT)
  decoder_block: DecoderBlockType = Field("llama2")
  quantization: None | Literal["", "fp8", "nanoo_fp8"] = Field("")
  max_num_checkpoints_to_keep: Optional[int] = None

class MaxTextConfig(Run, Moe):
  steps: int = Field(5)
  _private: int = 0
'''
COMMON_TYPES_PY = '''
import enum
class DecoderBlockType(enum.Enum):
  LLAMA2 = "llama2"
  MIXTRAL = "mixtral"
'''


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_generator_reads_an_image_maxtext_directory(tmp_path: Path) -> None:
    # What `podman cp <container>:/workspace/maxtext` gives for the 2025 src/MaxText layout.
    image = tmp_path / "image-maxtext"
    _tree(image, {
        "src/MaxText/configs/base.yml": "steps: 10\nexpert_balance: False\ncapacity_factor: -1.0\nquantization: ''\n",
        "src/MaxText/configs/types.py": TYPES_PY,
        "src/MaxText/common_types.py": COMMON_TYPES_PY,
        "src/MaxText/configs/models/tiny-moe.yml": "num_experts: 4\nbase_emb_dim: 64\n",
        "src/MaxText/configs/models/unlisted.yml": "base_emb_dim: 1\n",
    })
    out = tmp_path / "out"
    proc = run_gen("--dir", str(image), "--name", "rocm-jax-training-test", "--image", "rocm/jax-training:x@sha256:" + "e" * 64,
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    cat = json.loads((out / "rocm-jax-training-test.json").read_text())
    keys = cat["keys"]
    assert set(keys) == {"model_name", "steps", "base_output_directory", "expert_balance", "capacity_factor",
                         "matmul_precision", "decoder_block", "quantization", "max_num_checkpoints_to_keep"}
    assert keys["steps"] == {"type": "int", "optional": False, "default": 10}  # most-derived annotation wins
    assert keys["expert_balance"]["type"] == "bool" and keys["base_output_directory"]["type"] == "str"
    assert keys["matmul_precision"]["choices"] == ["default", "high"]
    assert keys["decoder_block"]["choices"] == ["llama2", "mixtral"]  # enum read from the imported module
    assert keys["quantization"] == {"type": "enum", "optional": True, "choices": ["", "fp8", "nanoo_fp8"], "default": ""}
    assert keys["max_num_checkpoints_to_keep"]["optional"] and keys["model_name"]["choices"] == ["default", "tiny-moe"]
    assert set(cat["models"]) == {"tiny-moe"} and cat["models"]["tiny-moe"]["num_experts"] == 4
    assert cat["source"] == {"kind": "directory", "path": str(image), "layout": "src/MaxText/configs",
                             "image": "rocm/jax-training:x@sha256:" + "e" * 64}


def test_generator_reads_a_git_commit_of_the_old_layout(tmp_path: Path) -> None:
    git = shutil.which("git")
    assert git is not None
    repo = tmp_path / "maxtext"
    _tree(repo, {"MaxText/configs/base.yml": "per_device_batch_size: 12.0\nsteps: 150_001\nenable_checkpointing: True\n"
                                               "quantization: ''\nmax_num_checkpoints_to_keep: None\n",
                 "MaxText/configs/models/llama2-7b.yml": "base_emb_dim: 4096\n"})
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "fork"]):
        subprocess.run([git, "-C", str(repo), *cmd], check=True, env=env)
    commit = subprocess.run([git, "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # The work tree changes after the commit: the catalog is of the commit, not of the files.
    (repo / "MaxText/configs/base.yml").write_text("unrelated: 1\n")
    out = tmp_path / "out"
    proc = run_gen("--git", str(repo), "--commit", "main", "--repo-url", "https://github.com/ROCm/maxtext", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    cat = json.loads((out / f"rocm-maxtext-{commit[:12]}.json").read_text())
    assert cat["source"]["commit"] == commit and cat["source"]["ref"] == "main" and cat["source"]["layout"] == "MaxText/configs"
    assert cat["keys"]["per_device_batch_size"] == {"type": "number", "optional": False, "default": 12.0}
    assert cat["keys"]["steps"]["type"] == "int" and cat["keys"]["enable_checkpointing"]["type"] == "bool"
    assert cat["keys"]["max_num_checkpoints_to_keep"]["optional"] and "unrelated" not in cat["keys"]
    assert cat["models"] == {"llama2-7b": {"keys": ["base_emb_dim"], "base_emb_dim": 4096}}


DECODERS_PY = '''
class Decoder:
  def get_remat_policy(self):
    cfg = self.config
    remat_policy = cfg.remat_policy
    if remat_policy and remat_policy != "none":
      if remat_policy in {"minimal_with_context", "minimal_flash"}:
        policy = 1
      elif remat_policy == "minimal":
        policy = 2
      else:
        assert remat_policy == "full", "Remat policy needs to be on list of remat policies"
        policy = None
    return policy
'''
ATTENTION_OP_PY = '''
class AttentionOp:
  def apply_attention(self, q):
    if self.attention_kernel == "dot_product":
      return 1
    elif self.attention_kernel in ("flash", "autoselected"):
      return 2
    return 3  # no final else that raises: any other value runs, so attention stays a string
'''


def test_generator_reads_the_values_a_closed_dispatch_accepts(tmp_path: Path) -> None:
    """remat_policy is a plain str in MaxText's types; the values that work are those get_remat_policy
    compares it with before its final else asserts (a closed dispatch). One without that else is left alone."""
    tree = tmp_path / "mt"
    _tree(tree, {
        "src/MaxText/configs/base.yml": "remat_policy: full\nattention: autoselected\n",
        "src/MaxText/configs/types.py": "from pydantic import BaseModel, Field\n\nclass MaxTextConfig(BaseModel):\n"
                                        "  remat_policy: str | None = Field('full')\n  attention: str = Field('autoselected')\n",
        "src/MaxText/layers/decoders.py": DECODERS_PY,
        "src/MaxText/layers/attention_op.py": ATTENTION_OP_PY,
    })
    proc = run_gen("--dir", str(tree), "--name", "dispatch", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    keys = json.loads((tmp_path / "out" / "dispatch.json").read_text())["keys"]
    assert keys["remat_policy"] == {"type": "enum", "optional": True, "default": "full",
                                    "choices": ["", "none", "minimal_with_context", "minimal_flash", "minimal", "full"],
                                    "choices_from": "layers/decoders.py:get_remat_policy"}
    assert keys["attention"] == {"type": "str", "optional": False, "default": "autoselected"}
    shipped = maxtext_catalog("0.2.5").keys  # the installed maxtext's own code, read the same way
    assert {"full", "minimal", "save_dot_except_mlp", "custom"} <= set(shipped["remat_policy"].choices)
    assert shipped["remat_policy"].choices_from == "layers/nnx_decoders.py:get_remat_policy"
    assert {"autoselected", "dot_product", "flash", "cudnn_flash_te"} <= set(shipped["attention"].choices)


def test_generator_refuses_a_tree_without_maxtext_config(tmp_path: Path) -> None:
    proc = run_gen("--dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "no MaxText base.yml" in proc.stderr and not (tmp_path / "out").exists()
    _tree(tmp_path, {"configs/base.yml": "steps: 1\n"})
    proc = run_gen("--dir", str(tmp_path), "--name", "../escape", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--name" in proc.stderr and not (tmp_path / "out").exists()
