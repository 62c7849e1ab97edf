"""Render an exporter plugin the way the exporter does and read its samples back (plugin tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(collector: object) -> Samples:
    """name+labels -> value, through the text exposition format (what Prometheus parses)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, metric: str, **labels: str) -> float:
    return found[(metric, tuple(sorted(labels.items())))]


def names(found: Samples) -> set[str]:
    return {name for name, _ in found}
