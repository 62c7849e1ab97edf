"""``model.config_file`` on a real MaxText run (the tiny model on CPU): the spec's own YAML is
MaxText's config, its ``base_config: base.yml`` resolved against the installed MaxText's configs,
and ``model.overrides`` win over the file, as MaxText-Slurm's configs are used (issue 15).

The model's shape lives only in the file here (the spec removes tiny.yaml's overrides with null),
so a run that trains with those dimensions proves MaxText read the file; ``steps`` is 50 in the
file and 3 in the spec, so three steps prove the overrides apply on top.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Mxc, copy_specs

pytestmark = pytest.mark.training

CONFIG = """\
# A MaxText config of the spec's own, in MaxText-Slurm's shape: MaxText's base.yml underneath.
base_config: "base.yml"
model_name: "default"
hardware: "cpu"
steps: 50
dataset_type: "synthetic"
base_emb_dim: 64
base_num_query_heads: 2
base_num_kv_heads: 2
base_mlp_dim: 128
base_num_decoder_layers: 2
head_dim: 32
vocab_size: 256
max_target_length: 64
per_device_batch_size: 1
enable_checkpointing: False
"""

SPEC = """\
extends: specs/tiny.yaml
name: tiny-config-file
model:
  config_file: configs/tiny.gpu.yml
  overrides:
    dataset_type: null
    base_emb_dim: null
    base_num_query_heads: null
    base_num_kv_heads: null
    base_mlp_dim: null
    base_num_decoder_layers: null
    head_dim: null
    vocab_size: null
    max_target_length: null
    per_device_batch_size: null
    learning_rate_schedule_steps: null
    steps: 3
checkpoint:
  period: 0
restart:
  max: 0
runtime:
  preflight:
    stale_processes: false
"""


def test_a_tiny_run_trains_from_the_config_file_with_overrides_on_top(mxc: Mxc, mxc_home: Path,
                                                                      tmp_path: Path) -> None:
    copy_specs(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.gpu.yml").write_text(CONFIG)
    spec = tmp_path / "tiny-file.yaml"
    spec.write_text(SPEC)
    built = mxc("build", str(spec), "-q", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    bundle = built.stdout.strip().splitlines()[-1]
    assert json.loads((mxc_home / "bundles" / bundle / "spec.json").read_text())["model"]["overrides"] == {"steps": 3}

    out = mxc("run", bundle, "--yes", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run = mxc_home / "runs" / out.stdout.strip().splitlines()[-1]
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "succeeded", record.get("message")
    assert (run / "model" / "tiny.gpu.yml").read_text() == CONFIG, "MaxText got the bundle's copy"
    log = (run / "train.log").read_text()
    assert f"{run}/model/tiny.gpu.yml model_name=default steps=3" in log, "the file is MaxText's first argument"
    params = {line.split("Config param ", 1)[1] for line in log.splitlines() if "Config param " in line}
    assert {"base_emb_dim: 64", "vocab_size: 256", "base_num_decoder_layers: 2", "steps: 3"} <= params
    assert "hardware: cpu" in params, "a key only the file sets"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "step" in json.loads(line)]
    assert max(steps) == 2, "three steps (0..2): the spec's steps=3 over the file's 50"
