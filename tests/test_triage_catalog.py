"""The triage catalog (mxc/runtime/triage/patterns.yaml) is data: check it like code.

Every pattern names its source and carries an example line that must be classified as its
own cause under the first-match rule; every cause is the verdict of at least one saved
fixture; GPU-only fixtures say where their error text comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.runtime.triage import catalog

FIXTURES = Path(__file__).parent / "fixtures" / "triage"
CONSEQUENCES_ONLY = {"collective_timeout", "step_cancelled"}  # asserted through also_seen of multi-rank fixtures


def cases() -> dict[str, dict[str, Any]]:
    return {d.name: yaml.safe_load((d / "case.yaml").read_text()) for d in sorted(FIXTURES.iterdir()) if d.is_dir()}


def test_every_pattern_classifies_its_own_example_first() -> None:
    cat = catalog.load()
    assert len(cat.patterns) > 40
    for pattern in cat.patterns:
        assert pattern.source.strip(), pattern.regex.pattern
        assert pattern.regex.search(pattern.example), (pattern.cause, pattern.example)
        assert cat.prefilter.search(pattern.example), pattern.example
        first = next(p for p in cat.patterns if p.regex.search(pattern.example))
        assert first.cause == pattern.cause, f"{pattern.example!r} is classified {first.cause}, not {pattern.cause}"


def test_ordinary_lines_match_nothing() -> None:
    """Lines every healthy run prints must not look like failures."""
    cat = catalog.load()
    healthy = [
        "I1123 09:50:45.737018 139960465107840 metric_logger.py:265] completed step: 29, seconds: 0.021, "
        "TFLOP/s/device: 0.002, Tokens/s/device: 3025.004, total_weights: 64, loss: 5.856, lm_loss: 5.856",
        "I1123 09:51:35.752123 140249833383616 async_checkpointer.py:325] [process=0][thread=save_finalize] "
        "No errors found in background save thread=async_save.",
        "I1123 10:13:01.736296 140117957114752 checkpointing.py:803] No existing checkpoints found, not restoring checkpoint.",
        "[mxc vm rank 0] stage train: start (limit 900s)",
        "[NO-OP] mldiagnostics: dependency missing; using stub. (ModuleNotFoundError)",
        "I1123 10:16:16.389821   14049 coordination_service_agent.cc:275] Polling for error from coordination service. "
        "This is a long-running RPC that will return only if an error is encountered or cancelled",
        "W1123 10:06:29.790558 140701097622400 x2num.py:13] NaN or Inf found in input tensor.",
        "gpu01:1:1 [0] NCCL WARN Missing \"iommu=pt\" from kernel command line which can lead to system instablity or hang!",
    ]
    for line in healthy:
        assert not any(p.regex.search(line) for p in cat.patterns), line


def test_every_cause_has_a_fixture() -> None:
    verdicts = {case["expect"]["cause"] for case in cases().values()}
    missing = set(catalog.load().causes) - verdicts - CONSEQUENCES_ONLY
    assert not missing, f"causes without a saved fixture: {sorted(missing)}"


def test_fixtures_say_where_their_text_comes_from() -> None:
    for name, case in cases().items():
        source = case["source"]
        assert source.startswith(("provoked here", "synthetic", "real", "MaxText")), (name, source)
        if source.startswith("synthetic, GPU-only"):
            assert "public issue" in source and "https://github.com/" in source, name


@pytest.mark.parametrize("bad, message", [
    ({"causes": [{"id": "x", "title": "t", "blame": "code", "priority": 1, "try": [], "extra": 1}]}, "unknown keys"),
    ({"causes": [{"id": "x", "title": "t", "blame": "weather", "priority": 1, "try": []}]}, "blame"),
    ({"causes": [{"id": "x", "title": "t", "blame": "code", "priority": 1, "try": [],
                  "patterns": [{"regex": "boom", "source": "here"}]}]}, "needs a source and an example"),
    ({"causes": [{"id": "x", "title": "t", "blame": "code", "priority": 1, "try": "do it"}]}, "list of strings"),
])
def test_a_broken_catalog_is_rejected(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        catalog.parse(bad)
