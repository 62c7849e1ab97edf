"""check.accept: a warning accepted on review is reported as a note with its reason and no longer
fails `mxc check`; an acceptance that matches no warning (fixed, or an error) is itself a warning;
errors cannot be accepted; a spec without the section keeps its bundle hash."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO, Mxc

ROCM_SPEC = """\
schema: mxc/v1
name: accept-test
image: {ref: docker.io/rocm/jax-training:maxtext-v26.2, digest: "sha256:%s"}
code: {from_image: true, entry: {module: MaxText.train, workdir: /workspace/maxtext}}
model: {model_name: default, overrides: {steps: 5}}
env:
  vars:
    CUDA_DEVICE_MAX_CONNECTIONS: "1"
    HIP_VISIBLE_DEVICES: "0"
resources: {nodes: 1, gpus_per_node: 8, gpu_vendor: nvidia}
runtime: {backend: slurm, container: podman}
""" % ("ab" * 32)


def _check(mxc: Mxc, tmp_path: Path, text: str) -> tuple[int, list[dict[str, object]]]:
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    out = mxc("check", str(spec), "--format", "json")
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)["findings"]


def test_an_accepted_warning_is_a_note_and_the_check_passes(mxc: Mxc, tmp_path: Path) -> None:
    amd = ROCM_SPEC.replace("gpu_vendor: nvidia", "gpu_vendor: amd").replace('    HIP_VISIBLE_DEVICES: "0"\n', "")
    code, findings = _check(mxc, tmp_path, amd)
    assert code == 1 and [(f["rule"], f["severity"]) for f in findings if f["rule"] == "env-var-vendor"] == [
        ("env-var-vendor", "warning")]
    code, findings = _check(mxc, tmp_path, amd + (
        "check:\n  accept:\n    - {rule: env-var-vendor, key: env.vars.CUDA_DEVICE_MAX_CONNECTIONS,"
        " why: the reference sets it}\n"))
    [vendor] = [f for f in findings if f["rule"] == "env-var-vendor"]
    assert code == 0, findings
    assert vendor["severity"] == "note" and str(vendor["message"]).startswith("accepted (the reference sets it): ")


def test_errors_cannot_be_accepted_and_stale_acceptances_warn(mxc: Mxc, tmp_path: Path) -> None:
    # HIP_VISIBLE_DEVICES on NVIDIA is an error (a GPU selection CUDA ignores): accepting it changes nothing
    code, findings = _check(mxc, tmp_path, ROCM_SPEC + (
        "check:\n  accept:\n"
        "    - {rule: env-var-vendor, key: env.vars.HIP_VISIBLE_DEVICES, why: tried}\n"
        "    - {rule: xla-flag-unknown, key: env.xla_flags.gone, why: fixed long ago}\n"))
    assert code == 1
    hip = [f for f in findings if f["key"] == "env.vars.HIP_VISIBLE_DEVICES"]
    assert [f["severity"] for f in hip] == ["error"]
    stale = sorted((f["key"], f["line"]) for f in findings if f["rule"] == "check-accept")
    assert stale == [("check.accept.0", 14), ("check.accept.1", 15)]
    assert all(f["severity"] == "warning" for f in findings if f["rule"] == "check-accept")


def test_a_malformed_acceptance_is_one_clear_line(mxc: Mxc, tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(ROCM_SPEC + "check:\n  accept:\n    - {rule: env-var-vendor, key: env.vars.X}\n")
    out = mxc("build", str(spec))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{spec}:14: check.accept.0.why: " in out.stderr, out.stderr


def test_specs_without_the_section_keep_their_bundle_hash(mxc: Mxc) -> None:
    spec_json = (REPO / "tests/golden/tiny/spec.json").read_text()
    assert '"check"' not in spec_json
