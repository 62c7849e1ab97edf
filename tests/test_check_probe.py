"""--probe for real: jaxlib parses the flags and MaxText's pyconfig validates the overrides.

The cases here pass every static rule (the catalogs cannot know an enum flag's spellings or
MaxText's cross-field checks), so only the real parsers can catch them.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mxc.compiler.check.probe_plan import maxtext_message
from tests.check_support import CPU_SPEC, spec
from tests.conftest import Mxc

BAD_FLAGS = spec(
    CPU_SPEC,
    env__xla_flags={"xla_gpu_enable_command_buffer": "FUSION,BOGUS", "xla_gpu_autotune_level": 2},
    env__vars__XLA_FLAGS="--xla_gpu_pipeline_all_gather=maybe",
    model__overrides__use_tokamax_splash=True,
    model__overrides__use_jax_splash=True,
)


def test_probe_catches_what_static_rules_cannot(mxc: Mxc, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = yaml.safe_dump(BAD_FLAGS, sort_keys=False)
    path.write_text(text)
    static = mxc("check", str(path))
    assert static.returncode == 0, static.stdout  # the catalogs and rules see nothing wrong

    out = mxc("check", str(path), "--probe", "--json")
    assert out.returncode == 1, out.stderr[-2000:]
    report = json.loads(out.stdout)
    by_key = {f["key"]: f for f in report["findings"] if f["rule"].startswith("probe-")}
    lines = text.splitlines()

    flag = by_key["env.xla_flags.xla_gpu_enable_command_buffer"]
    assert flag["rule"] == "probe-xla" and "BOGUS" in flag["message"] and "jaxlib 0.12.0.1 rejects" in flag["message"]
    assert "xla_gpu_enable_command_buffer" in lines[flag["line"] - 1]
    raw = by_key["env.vars.XLA_FLAGS"]
    assert "--xla_gpu_pipeline_all_gather=maybe" in raw["message"] and "XLA_FLAGS" in lines[raw["line"] - 1]
    assert "env.xla_flags.xla_gpu_autotune_level" not in by_key  # a good flag stays quiet

    mt = [f for f in report["findings"] if f["rule"] == "probe-maxtext"]
    assert len(mt) == 1 and "use_tokamax_splash" in mt[0]["message"] and "maxtext 0.2.5" in mt[0]["message"]
    assert mt[0]["key"] in ("model.overrides.use_tokamax_splash", "model.overrides.use_jax_splash")
    probe = report["probe"]
    assert probe["jaxlib"] == "0.12.0.1" and probe["tokens"] == 3 and probe["maxtext_sets"] == 1
    assert sorted(probe["rejected_tokens"]) == ["--xla_gpu_enable_command_buffer=FUSION,BOGUS",
                                                "--xla_gpu_pipeline_all_gather=maybe"]


def test_probe_on_a_matrix_asks_each_distinct_question_once(mxc: Mxc, tmp_path: Path) -> None:
    job = spec(CPU_SPEC, drop=("model__overrides__base_emb_dim",))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    (tmp_path / "sweep.yaml").write_text(
        "matrix: mxc/v1\nspec: job.yaml\naxes:\n"
        "  env.xla_flags.xla_gpu_pipeline_all_gather: ['on', 'off', 'sometimes']\n"
        "  env.xla_flags.xla_gpu_autotune_level: [1, 2, 3, 4]\n"
        "  model.overrides.dataset_type: [synthetic, hf]\n")
    out = mxc("check", "--matrix", str(tmp_path / "sweep.yaml"), "--probe", "--json")
    assert out.returncode == 1, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["summary"]["combinations"] == 24
    assert report["probe"]["tokens"] == 3 + 4 and report["probe"]["maxtext_sets"] == 2
    (bad,) = [f for f in report["findings"] if f["rule"] == "probe-xla"]
    assert bad["file"].endswith("sweep.yaml") and bad["line"] == 4
    assert len(bad["combinations"]) == 8  # every combination with 'sometimes'
    (hf,) = [f for f in report["findings"] if f["rule"] == "probe-maxtext"]
    assert hf["line"] == 6 and len(hf["combinations"]) == 12 and "hf" in hf["message"].lower()


def test_maxtext_messages_name_their_keys() -> None:
    keys, text = maxtext_message("ValueError: 'stepz' not in 'emb_dim', 'mlp_dim'.")
    assert keys == ["stepz"] and text == "MaxText: 'stepz' is not a config key"
    keys, text = maxtext_message(
        "ValidationError: 1 validation error for MaxTextConfig\ndataset_type\n  Input should be 'synthetic' or 'hf' "
        "[type=enum, input_value='Synthetic', input_type=str]\n    For further information visit https://errors.pydantic.dev")
    assert keys == ["dataset_type"] and "Input should be 'synthetic' or 'hf'" in text
