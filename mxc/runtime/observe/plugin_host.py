"""Finding exporter plugins and running them so that one failing plugin never stops the rest.

Discovery, in order (the first plugin found under a name wins):

1. ``*.py`` files in the plugins directories (``--plugins-dir``; ``$MXC_HOME/plugins``), all
   of them: dropping a file there enables it;
2. the entry point group ``mxc.exporter_plugins`` (mxc's own: host, network, gpu, tensorboard);
3. ``mxc.plugins.<name>`` itself, for an editable install whose entry points are stale.

Names listed in exporter.json but found nowhere are reported as disabled ("not found"), and
so are names that are no plugin name at all (``../x``, ``a.b``: ``PLUGIN_NAME_PATTERN``), which
are never looked up: a name must not lead discovery out of the plugin directories or package.
A plugin whose ``create`` or ``collect`` raises is disabled with the reason logged once and
exported as ``mxc_exporter_plugin_up{plugin=...} 0``; the others keep serving.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins import PLUGIN_NAME_PATTERN
from mxc.plugins.api import ENTRY_POINT_GROUP, ExporterPlugin, PluginContext, PluginUnavailable

log = logging.getLogger("mxc.exporter")

Factory = Callable[[PluginContext], ExporterPlugin]
_NAME = re.compile(PLUGIN_NAME_PATTERN)


@dataclass
class PluginSlot:
    """One plugin's state in this exporter."""

    name: str
    origin: str
    plugin: ExporterPlugin | None = None
    status: str = "up"  # up, unavailable, failed, not found
    reason: str = ""
    errors: int = 0
    last_seconds: float = 0.0

    @property
    def up(self) -> bool:
        return self.plugin is not None and self.status == "up"


def _load_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mxc_user_plugin_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def discover(wanted: Sequence[str], plugin_dirs: Sequence[Path]) -> dict[str, tuple[str, Callable[[], Any]]]:
    """name -> (origin, loader); a loader returns the plugin module (or factory) when called."""
    found: dict[str, tuple[str, Callable[[], Any]]] = {}
    for folder in plugin_dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            found.setdefault(path.stem, (str(path), partial(_load_file, path)))
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, (f"entry point {ep.value}", ep.load))
    for name in wanted:
        if name not in found and valid_name(name) and _shipped(name):
            found[name] = (f"mxc.plugins.{name}", partial(importlib.import_module, f"mxc.plugins.{name}"))
    return found


def valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _shipped(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"mxc.plugins.{name}") is not None
    except (ImportError, ValueError):
        return False


def _factory(loaded: Any) -> Factory:
    create = getattr(loaded, "create", None)
    if callable(create):
        return create  # type: ignore[no-any-return]
    if callable(loaded):
        return loaded  # type: ignore[no-any-return]
    raise TypeError("a plugin module must define create(context)")


def _make(loader: Callable[[], Any], context: PluginContext) -> ExporterPlugin:
    return _factory(loader())(context)


class PluginHost:
    """A prometheus-client collector over every plugin, plus its own health series."""

    def __init__(self, context: PluginContext, wanted: Sequence[str], plugin_dirs: Sequence[Path] = (),
                 extra: Iterable[tuple[str, Any]] = ()) -> None:
        self.context = context
        self.slots: list[PluginSlot] = []
        wanted = [n if isinstance(n, str) else repr(n) for n in wanted]  # exporter.json is only JSON
        found = discover(wanted, plugin_dirs)
        names = list(dict.fromkeys([*wanted, *[n for n, (origin, _) in found.items() if origin.endswith(".py")]]))
        for name in names:
            if name not in found and not valid_name(name):
                self.slots.append(PluginSlot(name, "", status="not found",
                                             reason="not a plugin name (letters, digits and _ only)"))
                log.warning("plugin %r: not a plugin name; ignored", name)
                continue
            if name not in found:
                self.slots.append(PluginSlot(name, "", status="not found", reason="no plugin of that name"))
                log.warning("plugin %s: not found (entry point %s, plugins dirs %s)", name, ENTRY_POINT_GROUP,
                            [str(d) for d in plugin_dirs])
                continue
            origin, loader = found[name]
            self.slots.append(self._start(name, origin, partial(_make, loader, context)))
        for name, plugin in extra:
            self.slots.append(PluginSlot(name, "built in", plugin=plugin))

    def _start(self, name: str, origin: str, make: Callable[[], ExporterPlugin]) -> PluginSlot:
        slot = PluginSlot(name, origin)
        try:
            slot.plugin = make()
            log.info("plugin %s: loaded from %s", name, origin)
        except PluginUnavailable as exc:
            slot.status, slot.reason = "unavailable", str(exc)
            log.info("plugin %s: disabled: %s", name, exc)
        except Exception as exc:
            slot.status, slot.reason = "failed", f"{type(exc).__name__}: {exc}"
            slot.errors += 1
            log.error("plugin %s: disabled, it failed to start: %s", name, slot.reason)
        return slot

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        for slot in self.slots:
            if not slot.up:
                continue
            assert slot.plugin is not None
            started = time.perf_counter()
            try:
                families = list(slot.plugin.collect())
                bad = [f for f in families if not isinstance(f, Metric)]
                if bad:
                    raise TypeError(f"collect() returned {type(bad[0]).__name__}, not a prometheus_client Metric")
                out.extend(families)
            except Exception as exc:
                slot.status, slot.reason = "failed", f"{type(exc).__name__}: {exc}"
                slot.errors += 1
                slot.plugin = None
                log.error("plugin %s: disabled, collect() raised %s", slot.name, slot.reason)
            slot.last_seconds = time.perf_counter() - started
        out.extend(self._health())
        return out

    def _health(self) -> list[Metric]:
        up = GaugeMetricFamily("mxc_exporter_plugin_up", "1 while the plugin serves, 0 once disabled", labels=["plugin"])
        info = GaugeMetricFamily("mxc_exporter_plugin_info", "why a plugin is in its state (status, reason)",
                                 labels=["plugin", "status", "reason"])
        errors = CounterMetricFamily("mxc_exporter_plugin_errors", "exceptions raised by the plugin", labels=["plugin"])
        seconds = GaugeMetricFamily("mxc_exporter_plugin_collect_seconds", "time of the plugin's last collect()",
                                    labels=["plugin"])
        for slot in self.slots:
            up.add_metric([slot.name], 1 if slot.up else 0)
            info.add_metric([slot.name, slot.status, slot.reason[:200]], 1)
            errors.add_metric([slot.name], slot.errors)
            seconds.add_metric([slot.name], slot.last_seconds)
        return [up, info, errors, seconds]

    def status(self) -> dict[str, dict[str, str]]:
        return {s.name: {"status": s.status, "reason": s.reason, "origin": s.origin} for s in self.slots}
