"""Training plugin: every scalar MaxText logs (not a fixed list), MFU against the GPU's peak,
tokens/s/device, from metrics files and from real TensorBoard event files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxc.plugins import gpu, peak_flops, tensorboard
from mxc.plugins.api import PluginContext
from tests.plugin_samples import names, samples, value

MOE_LINE = {  # the keys MaxText's metric_logger writes for a MoE model with MTP, plus one a future version may add
    "step": 3.0, "learning/loss": 5.5, "learning/moe_lb_loss": 0.012, "learning/mtp_loss": 6.25,
    "learning/param_norm": 251.5, "learning/raw_grad_norm": 3.5, "learning/grad_norm": 1.0,
    "learning/total_weights": 8192.0, "perf/step_time_seconds": 2.0, "perf/per_device_tflops_per_sec": 494.7,
    "perf/per_device_tokens_per_sec": 4096.0, "learning/current_learning_rate": 3e-4, "some/new_scalar": 7,
    "not/a/number": "text", "flag": True,
}


def write_metrics(run: Path, lines: list[dict[str, object]], attempt: int = 0, rank: int = 0) -> None:
    folder = run / "metrics"
    folder.mkdir(exist_ok=True)
    with open(folder / f"attempt-{attempt}.rank-{rank}.jsonl", "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)


def test_every_scalar_is_exported_by_tag(tmp_path: Path) -> None:
    write_metrics(tmp_path, [MOE_LINE, {"step": 3.0, "eval/avg_loss": 5.9, "eval/total_weights": 4096.0}])
    found = samples(tensorboard.create(PluginContext(run_dir=tmp_path)))
    for tag in ("learning/moe_lb_loss", "learning/mtp_loss", "learning/param_norm", "learning/raw_grad_norm",
                "some/new_scalar", "eval/avg_loss", "learning/loss"):
        assert ("mxc_train_scalar", (("rank", "0"), ("tag", tag))) in found, tag
    assert value(found, "mxc_train_scalar", rank="0", tag="learning/moe_lb_loss") == 0.012
    assert value(found, "mxc_train_step_total", rank="0") == 1  # the eval line is not a step
    assert not any(dict(labels).get("tag") in ("not/a/number", "flag", "step") for _, labels in found)
    assert value(found, "mxc_train_tokens_per_second_per_device", rank="0") == 4096.0


def test_a_scalar_keeps_its_newest_value_across_restarts(tmp_path: Path) -> None:
    write_metrics(tmp_path, [{**MOE_LINE, "step": float(s), "learning/param_norm": 250.0 + s} for s in range(5)])
    plugin = tensorboard.create(PluginContext(run_dir=tmp_path))
    assert value(samples(plugin), "mxc_train_scalar", rank="0", tag="learning/param_norm") == 254.0
    # attempt 1 resumes at step 3 and recomputes: the value follows the newest line
    write_metrics(tmp_path, [{**MOE_LINE, "step": 3.0, "learning/param_norm": 1.0}], attempt=1)
    assert value(samples(plugin), "mxc_train_scalar", rank="0", tag="learning/param_norm") == 1.0


def test_tags_per_rank_are_bounded(tmp_path: Path) -> None:
    write_metrics(tmp_path, [{"step": 1.0, "learning/loss": 1.0, **{f"x/{i}": float(i) for i in range(400)}}])
    found = samples(tensorboard.create(PluginContext(run_dir=tmp_path)))
    assert sum(1 for n, _ in found if n == "mxc_train_scalar") == tensorboard.MAX_TAGS


@pytest.mark.parametrize("bad_step", ["inf", "nan", "x", None])
def test_a_line_with_an_unusable_step_is_skipped(tmp_path: Path, bad_step: object) -> None:
    write_metrics(tmp_path, [{"step": bad_step, "learning/loss": 1.0}, {"step": 2, "learning/loss": 2.0}])
    found = samples(tensorboard.create(PluginContext(run_dir=tmp_path)))
    assert value(found, "mxc_train_last_step", rank="0") == 2 and value(found, "mxc_train_step_total", rank="0") == 1


def test_mfu_from_the_spec_peak(tmp_path: Path) -> None:
    write_metrics(tmp_path, [MOE_LINE])
    plugin = tensorboard.create(PluginContext(run_dir=tmp_path, config={"peak_tflops": 989.4}))
    found = samples(plugin)
    assert value(found, "mxc_train_mfu_ratio", rank="0") == pytest.approx(494.7 / 989.4)
    assert value(found, "mxc_train_peak_tflops_per_device", model="spec") == 989.4


def test_mfu_from_the_gpu_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_metrics(tmp_path, [MOE_LINE])
    monkeypatch.setattr(gpu, "model_names", lambda: ["AMD Instinct MI300X"] * 8)
    found = samples(tensorboard.create(PluginContext(run_dir=tmp_path)))
    assert value(found, "mxc_train_mfu_ratio", rank="0") == pytest.approx(494.7 / 1307.4)
    assert value(found, "mxc_train_peak_tflops_per_device", model="MI300X") == 1307.4


def test_no_mfu_without_a_known_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_metrics(tmp_path, [MOE_LINE])
    monkeypatch.setattr(gpu, "model_names", lambda: ["Tesla T4"])
    for config in ({}, {"peak_tflops": True}, {"peak_tflops": -1}, {"peak_tflops": "989"}):
        found = samples(tensorboard.create(PluginContext(run_dir=tmp_path, config=config)))
        assert "mxc_train_mfu_ratio" not in names(found) and "mxc_train_peak_tflops_per_device" not in names(found)
    assert peak_flops.peak_for("Tesla T4") is None


def test_every_tensorboard_scalar_from_real_event_files(tmp_path: Path) -> None:
    """Event files written by tensorboardX as MaxText does, with tags no list in mxc names."""
    from tensorboardX import SummaryWriter  # type: ignore[import-untyped]

    logdir = tmp_path / "output" / tmp_path.name / "tensorboard" / tmp_path.name
    writer = SummaryWriter(str(logdir))
    for step in range(3):
        writer.add_scalar("learning/loss", 6.0 - step, step)
        writer.add_scalar("learning/moe_lb_loss", 0.01 * step, step)
        writer.add_scalar("perf/per_device_tflops_per_sec", 100.0 + step, step)
    writer.add_scalar("eval/avg_loss", 4.5, 2)
    writer.close()
    found = samples(tensorboard.create(PluginContext(run_dir=tmp_path, config={"peak_tflops": 1000})))
    assert value(found, "mxc_train_scalar", rank="0", tag="learning/moe_lb_loss") == pytest.approx(0.02)
    assert value(found, "mxc_train_scalar", rank="0", tag="eval/avg_loss") == 4.5
    assert value(found, "mxc_train_mfu_ratio", rank="0") == pytest.approx(0.102)


def test_a_slow_step_between_two_scrapes_is_not_missed(tmp_path: Path) -> None:
    """Steps of 0.02 s, one of 12 s, all logged between two scrapes: the step-time gauge shows the
    newest step only, the max gauge shows the slow one for two scrape intervals."""
    now = [1000.0]
    plugin = tensorboard.TrainingMetricsPlugin(PluginContext(run_dir=tmp_path, config={"scrape_interval": 5}),
                                               clock=lambda: now[0])
    times = [0.02] * 5 + [12.0] + [0.02] * 3
    write_metrics(tmp_path, [{**MOE_LINE, "step": float(s), "perf/step_time_seconds": t} for s, t in enumerate(times)])
    found = samples(plugin)
    assert value(found, "mxc_train_step_time_seconds", rank="0") == 0.02
    assert value(found, "mxc_train_step_time_max_seconds", rank="0") == 12.0
    now[0] += 9.0  # the next scrape, nothing new logged: still in the window (another reader may have scraped)
    assert value(samples(plugin), "mxc_train_step_time_max_seconds", rank="0") == 12.0
    now[0] += 2.0  # past two intervals: no step logged in the window, no value (a stalled training)
    assert "mxc_train_step_time_max_seconds" not in names(samples(plugin))
    write_metrics(tmp_path, [{**MOE_LINE, "step": 9.0, "perf/step_time_seconds": 0.03}])
    assert value(samples(plugin), "mxc_train_step_time_max_seconds", rank="0") == 0.03


@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0, 1e4, allow_nan=False)), max_size=60))
def test_the_slowest_recent_step_is_the_window_maximum(reads: list[tuple[float, float]]) -> None:
    """The monotonic queue answers what a scan of every step read in the window would."""
    state, now, seen = tensorboard.RankState(), 0.0, []
    for advance, seconds in reads:
        now += advance
        state.step_time(seconds, now, window=20.0)
        seen.append((now, seconds))
        state.forget(now, 20.0)
        in_window = [s for t, s in seen if now - t <= 20.0]
        assert state.slowest() == (max(in_window) if in_window else None)
