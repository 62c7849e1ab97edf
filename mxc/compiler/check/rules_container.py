"""Rules on how the container runs (runtime.container_options)."""

from __future__ import annotations

from collections.abc import Iterator

from mxc.compiler.check.subject import Issue, Subject


def container_privileged(s: Subject) -> Iterator[Issue]:
    """A privileged container (runtime.container_options.privileged): it sees every host device and
    holds every capability, which no training needs once its devices and capabilities are listed;
    reported on every check so the explicit flag stays visible to reviewers."""
    if s.spec.runtime.container_options.privileged:
        yield Issue(("runtime", "container_options", "privileged"),
                    f"the {s.spec.runtime.container} container runs --privileged: every host device and capability",
                    "list what training needs instead (container_options.devices, group_add, cap_add)")
