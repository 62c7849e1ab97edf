"""Spec values that passed without comment on c388a5b (issue 25): a Slack webhook URL pasted
percent-encoded or base64-encoded (the secret scan knew only the plain form), ``model.config:
../../../../etc/passwd`` (the trainer read any file of the node as its config), and any
``resources.sbatch_extra`` option, including those that break the run (``--array`` starts copies of
one run in one run directory, ``--export=NONE`` drops the variables mxc run exports, ``--no-requeue``
switches the restart policy off).
"""

from __future__ import annotations

import base64
import re
import urllib.parse

import pytest

from tests.check_support import CPU_SPEC, check, of_rule, spec
from tests.test_attacks_input import compile_files, errors_of, tiny_with

SLACK = "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/" + "c" * 24


@pytest.mark.parametrize("how, value", [
    ("percent-encoded", urllib.parse.quote(SLACK, safe="")),
    ("percent-encoded", "https://example.com/login?next=" + urllib.parse.quote(SLACK, safe="")),
    ("percent-encoded 2 times", urllib.parse.quote(urllib.parse.quote(SLACK, safe=""), safe="")),
    ("base64", base64.b64encode(SLACK.encode()).decode()),
    ("base64", base64.urlsafe_b64encode(SLACK.encode()).decode().rstrip("=")),
    ("base64", base64.b64encode(b'{"webhook": "' + SLACK.encode() + b'"}').decode()),
])
def test_an_encoded_webhook_url_is_refused_like_a_plain_one(how: str, value: str) -> None:
    (error,) = errors_of(tiny_with(f"description: '{value}'\n"))
    assert f"'description' looks like a Slack webhook URL, {how}; a spec must not hold secrets" in error, error


def test_ordinary_encoded_looking_values_pass() -> None:
    compile_files(tiny_with("description: 'see https%3A%2F%2Fexample.com%2Fdocs and "
                            "L3dvcmtzcGFjZS9tYXh0ZXh0L3NyYy9NYXhUZXh0L2NvbmZpZ3MvYmFzZS55bWw='\n"
                            "runtime:\n  mounts: ['/workspace/maxtext/src/MaxText/configs:/configs:ro']\n"))


@pytest.mark.parametrize("config", ["../../../../etc/passwd", "/etc/passwd", "models/../../../x.yml",
                                    "a/..\\..\\b.yml"])
def test_model_config_stays_inside_the_configs(config: str) -> None:
    (error,) = errors_of(tiny_with(f"model:\n  model_name: default\n  config: '{config}'\n"))
    assert re.search(r"model\.config: '.*' leaves code\.entry\.configs", error), error
    compile_files(tiny_with("model:\n  model_name: default\n  config: models/gpt3-52k.yml\n"))


@pytest.mark.parametrize("option, why", [
    ("--array=0-9", "an array job runs copies of this one run"),
    ("--export=NONE", "--export replaces them"),
    ("--no-requeue", "the restart policy"),
    ("--wrap=echo", "instead of the bundle's job.sbatch"),
    ("--output=/tmp/x.log", "mxc run names the job's log"),
    ("--ntasks=8", "one task per node"),
    ("--time=10", "mxc sets --time from resources.time; set that instead"),
    ("--nodes=4", "from resources.nodes"),
    ("--signal=B:USR1@60", "from runtime.signal_seconds"),
    ("--container=/img", "mxc starts containers itself"),
])
def test_sbatch_options_that_break_the_run_are_errors(option: str, why: str) -> None:
    (error,) = errors_of(tiny_with(f"resources:\n  sbatch_extra: ['--gpu-bind=closest', '{option}']\n"))
    assert error.startswith("spec.yaml:3: resources.sbatch_extra.1: " + option) and why in error, error


def test_sbatch_options_with_a_side_effect_are_warnings_and_site_options_pass() -> None:
    findings, _ = check(spec(CPU_SPEC, resources__sbatch_extra=["--hold", "--gpu-bind=closest", "--comment=x"]))
    (f,) = of_rule(findings, "sbatch-extra")
    assert f.severity == "warning" and f.key == "resources.sbatch_extra.0" and "until someone releases it" in f.message
    assert not of_rule(check(spec(CPU_SPEC, resources__sbatch_extra=["--gpu-bind=closest"]))[0], "sbatch-extra")

