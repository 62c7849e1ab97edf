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


def container_dangerous(s: Subject) -> Iterator[Issue]:
    """A capability, device, mount or group the spec gives the container through the explicit opt-in
    runtime.allow_dangerous (cap_add:SYS_ADMIN, mounts:/:/host, devices:/dev/sda, group_add:docker, ...):
    it reaches the host outside the container, which a reviewer does not see in the option itself;
    reported on every check so the opt-in stays visible. Without the opt-in such an option is a
    schema error (mxc/compiler/container_policy.py)."""
    for i, entry in enumerate(s.spec.runtime.allow_dangerous):
        yield Issue(("runtime", "allow_dangerous", i), f"{entry} is given to the {s.spec.runtime.container} container on purpose "
                    "(runtime.allow_dangerous): it reaches the host outside the container",
                    "keep it only if training needs it and the spec's reviewers agreed")
