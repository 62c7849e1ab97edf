"""One environment boundary (issue 23): the caller's shell reaches a training only through the
declared base and the spec's ``env.pass`` (mxc/node/envboundary.py), and ``mxc rerun`` compares and
verifies what it replays (mxc/runtime/replay.py). The real runs are in tests/test_rerun_verify.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxc.compiler.errors import SpecErrors
from mxc.compiler.pipeline import Bundle, compile_spec
from mxc.node import container, envboundary, envmerge
from mxc.node.contract import parse
from mxc.runtime.provenance.hostfacts import Drift
from mxc.runtime.replay import LossFollower, environment_drift, first_divergence, same
from tests.check_support import CPU_SPEC, check, line_of, of_rule, spec
from tests.conftest import REPO

NODE = {
    "PATH": "/usr/bin", "HOME": "/home/u", "USER": "u", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm",
    "TMPDIR": "/scratch/tmp", "SLURM_PROCID": "1", "SLURMD_NODENAME": "node2", "PMI_RANK": "1",
    "CUDA_VISIBLE_DEVICES": "0,1", "XLA_FLAGS": "--xla_cpu_enable_fast_math=true", "PYTHONPATH": "/home/u/lib",
    "LD_PRELOAD": "/tmp/evil.so", "MXC_PYTHON": "/venv/bin/python", "WANDB_API_KEY": "k" * 40, "HF_HOME": "/data/hf",
}


# ---- the boundary, as a function


def test_the_training_starts_from_the_base_and_the_passed_variables_only() -> None:
    base = envboundary.training_base(NODE, ["WANDB_API_KEY", "HF_HOME", "NOT_SET"])
    assert set(base) == {"PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "SLURM_PROCID", "SLURMD_NODENAME",
                         "PMI_RANK", "CUDA_VISIBLE_DEVICES", "WANDB_API_KEY", "HF_HOME"}
    assert "XLA_FLAGS" not in envboundary.training_base(NODE)  # left in a shell: never reaches the training
    # the caller's part (what a rerun compares): no scheduler or GPU variables, no mxc variables
    assert set(envboundary.from_caller(NODE, ["HF_HOME"])) == {"PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM",
                                                                "TMPDIR", "HF_HOME"}


def test_what_module_loads_set_crosses_and_a_caller_cannot_claim_it() -> None:
    before = {"PATH": "/usr/bin", "XLA_FLAGS": "--a", "_": "/usr/bin/env"}
    after = {"PATH": "/opt/cuda/bin:/usr/bin", "XLA_FLAGS": "--a", "CUDA_HOME": "/opt/cuda", "_": "/usr/bin/python3",
             "MXC_ENV_BEFORE_MODULES": "/tmp/x"}
    assert envboundary.module_vars(before, after) == ["CUDA_HOME", "PATH"]
    assert envboundary.parse_env0(b"A=1\0B=two\nlines\0=bad\0C\0") == {"A": "1", "B": "two\nlines"}
    node = {**after, envboundary.MODULE_VARS: "CUDA_HOME PATH"}
    assert envboundary.training_base(node)["CUDA_HOME"] == "/opt/cuda"
    assert envboundary.crossed(node, [])["modules"] == ["CUDA_HOME", "PATH"]


def test_a_container_gets_the_passed_variables_and_nothing_else_of_the_node() -> None:
    spec = parse(json.dumps(json.loads(_bundle(("runtime.container=podman", "image.ref=r/maxtext:1",
                                                f"image.digest=sha256:{'ab' * 32}", "code.from_image=true",
                                                "code.maxtext_version=null",
                                                "env.pass=[HF_HOME, WANDB_API_KEY]")).files["run.json"])))
    train_env = envboundary.training_base(NODE, spec.env_pass or [])
    request = container.container_env(spec.container, train_env, list(spec.env), dict(spec.env_merge), None,
                                      spec.env_pass or [])
    names = [name for name, _, _ in request]
    assert names[:2] == ["HF_HOME", "WANDB_API_KEY"] and "XLA_FLAGS" not in names and "PYTHONPATH" not in names
    assert envmerge.apply({"HF_HOME": "/image/hf"}, request)["HF_HOME"] == "/data/hf"  # passed: over the image's


def _bundle(sets: tuple[str, ...]) -> Bundle:
    return compile_spec(str(REPO / "specs" / "tiny.yaml"), lambda p: Path(p).read_bytes(), sets, mxc_version="test")


@pytest.mark.parametrize("value, message", [
    ("[PATH]", "env.pass: 'PATH' reaches the training without being passed"),
    ("[SLURM_JOB_ID]", "env.pass: 'SLURM_JOB_ID' reaches the training without being passed"),
    ("[MXC_RUN_DIR]", "MXC_* variables belong to mxc itself"),
    ("[HF_HOME, HF_HOME]", "a variable is named twice"),
    ("[LD_PRELOAD]", "env.pass.0: LD_PRELOAD makes the loader"),
    ("[BASH_ENV]", "env.pass.0: BASH_ENV cannot be passed"),
    ("[1X]", "env.pass.0"),
])
def test_what_a_spec_may_not_pass(value: str, message: str) -> None:
    with pytest.raises(SpecErrors) as err:
        _bundle((f"env.pass={value}",))
    assert message in str(err.value), str(err.value)


def test_a_dangerous_variable_passes_with_its_opt_in() -> None:
    bundle = _bundle(("env.pass=[LD_PRELOAD]", "env.allow_dangerous=[LD_PRELOAD]"))
    assert json.loads(bundle.files["run.json"])["env_pass"] == ["LD_PRELOAD"]
    assert "env_pass" not in json.loads(_bundle(()).files["run.json"])


# ---- what a rerun compares


def test_rerun_names_each_difference_that_reaches_the_training() -> None:
    spec = {"env": {"pass": ["HF_HOME", "HF_TOKEN"]}}
    training = {"caller": {"PATH": "/usr/bin", "HF_HOME": "/data/hf", "LANG": "C.UTF-8"}, "passed": ["HF_HOME", "HF_TOKEN"],
                "modules": []}
    now = {"PATH": "/usr/bin", "HF_HOME": "/other", "LANG": "C.UTF-8", "XLA_FLAGS": "--anything", "TERM": "dumb"}
    found = environment_drift(training, now, ["HF_HOME", "HF_TOKEN"], spec)
    assert found == [Drift("training env HF_HOME", "/data/hf", "/other"), Drift("training env TERM", "unset", "dumb"),
                     Drift("training env HF_TOKEN", "(a value, not recorded)", "unset")]
    same_shell = {"PATH": "/usr/bin", "HF_HOME": "/data/hf", "LANG": "C.UTF-8", "HF_TOKEN": "hf_x", "XLA_FLAGS": "-"}
    assert environment_drift(training, same_shell, ["HF_HOME", "HF_TOKEN"], spec) == []
    assert environment_drift(None, now, [], spec) is None  # nothing recorded: nothing to compare


def test_losses_are_compared_bit_for_bit_as_lines_arrive(tmp_path: Path) -> None:
    assert same(6.122978210449219, 6.122978210449219) and not same(0.0, -0.0) and same(float("nan"), float("nan"))
    expected = {0: 6.1232171058654785, 1: 5.9}
    divergence, equal = first_divergence(expected, [(0, 6.1232171058654785), (2, 1.0), (1, 5.900000000000001)])
    assert divergence is not None and (divergence.step, divergence.rerun, equal) == (1, 5.900000000000001, 1)
    parts = tmp_path / "metrics"
    parts.mkdir()
    follower = LossFollower(parts)
    part = parts / "attempt-0.rank-0.jsonl"
    part.write_text('{"step": 0, "learning/loss": 6.1}\n{"step": 1, "learn')
    assert follower.new() == [(0, 6.1)]  # the torn line waits for its end
    with part.open("a") as fh:
        fh.write('ing/loss": 5.5}\n')
    (parts / "attempt-1.rank-0.jsonl").write_text('{"step": 1, "learning/loss": 5.25}\n')
    (parts / "attempt-1.rank-1.jsonl").write_text('{"step": 1, "learning/loss": 9.0}\n')  # another rank
    assert follower.new() == [(1, 5.5), (1, 5.25)] and follower.new() == []


def test_check_reports_a_dangerous_passed_variable_at_its_line() -> None:
    findings, text = check(spec(CPU_SPEC, env__pass=["LD_PRELOAD"], env__allow_dangerous=["LD_PRELOAD"]))
    (found,) = of_rule(findings, "env-dangerous")
    assert found.key == "env.pass.0" and found.line == line_of(text, "- LD_PRELOAD")
    assert "LD_PRELOAD is passed from the caller's environment on purpose" in found.message
