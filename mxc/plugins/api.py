"""What an exporter plugin is: a module with ``create(context) -> plugin``.

The exporter (``mxc.runtime.observe.exporter``) calls ``collect()`` on every scrape and serves what
it yields. A plugin is isolated: an exception from ``create`` or ``collect`` disables that
plugin (with the reason logged and exported as ``mxc_exporter_plugin_up 0``), never the
exporter. ``PluginUnavailable`` from ``create`` is the polite form: "nothing to measure on
this node" (no GPU), logged as a reason, not as an error.

Plugins are found by the entry point group ``mxc.exporter_plugins`` (``name = "module"``)
and as ``*.py`` files in a plugins directory (``--plugins-dir``, ``$MXC_HOME/plugins``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import Metric

ENTRY_POINT_GROUP = "mxc.exporter_plugins"


class PluginUnavailable(Exception):
    """Raised by ``create`` when the plugin has nothing to measure here; the message says why."""


@dataclass(frozen=True)
class PluginContext:
    """What a plugin may know about the exporter it runs in."""

    run_dir: Path | None
    config: Mapping[str, Any] = field(default_factory=dict)  # the bundle's exporter.json
    node: str = ""
    ranks: tuple[int, ...] | None = None  # training ranks on this node (None: every rank found)
    tensorboard_dir: Path | None = None
    site_exporters: Mapping[str, int] = field(default_factory=dict)  # exporters the site runs here: name -> port
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("mxc.exporter"))


class ExporterPlugin(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]:
        """Metric families for one scrape. Keep it cheap: it runs on every scrape."""


class PluginFactory(Protocol):
    def __call__(self, context: PluginContext) -> ExporterPlugin: ...


@dataclass
class Parts:
    """A plugin's independent sources (``/proc/pressure``, the kernel log, ...): one that fails drops
    only its own series, and its reason is logged once, not on every scrape."""

    plugin: str
    log: logging.Logger
    failed: set[str] = field(default_factory=set)

    def collect(self, parts: Sequence[tuple[str, Callable[[], Iterator[Metric]]]]) -> list[Metric]:
        out: list[Metric] = []
        for part, families in parts:
            try:
                out.extend(families())
            except (OSError, ValueError) as exc:
                if part not in self.failed:
                    self.failed.add(part)
                    self.log.warning("%s: %s left out: %s", self.plugin, part, exc)
        return out
