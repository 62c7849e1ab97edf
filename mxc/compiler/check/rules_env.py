"""Rules about environment variables: vendor, allowed values, spelling, JAX platform."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

from mxc.compiler.check.catalogs import EnvVar, env_catalog
from mxc.compiler.check.subject import Issue, Subject
from mxc.compiler.contract_build import scalar_text
from mxc.compiler.errors import did_you_mean

_VENDOR_NAME = {"nvidia": "NVIDIA (CUDA)", "amd": "AMD (ROCm)"}
_TOKEN_SPLIT = re.compile(r"[,;:^=\s]+")
_PLATFORM_VENDOR = {"cuda": "nvidia", "rocm": "amd"}


@lru_cache(maxsize=1024)
def _suggest_var(name: str) -> str:
    """The one catalogued name that completes ``name`` (NCCL_IB_QPS -> NCCL_IB_QPS_PER_CONNECTION),
    else the closest spelling."""
    longer = [v for v in env_catalog().variables if v.startswith(name + "_")]
    return f"did you mean '{longer[0]}'?" if len(longer) == 1 else did_you_mean(name, env_catalog().variables)


def env_var_vendor(s: Subject) -> Iterator[Issue]:
    """A vendor-specific variable matches the spec's GPUs. In the other vendor's spec it is an error
    when it conflicts (a GPU selection that silently does not apply), a warning with the reason when
    the other vendor's libraries just never read it (CUDA_DEVICE_MAX_CONNECTIONS on ROCm, set by
    AMD's own scripts). Each catalogued vendor-specific variable says which, and why. In a CPU spec
    a GPU variable does nothing (warning)."""
    cat = env_catalog()
    vendor = s.spec.resources.gpu_vendor
    for name in s.spec.env.vars:
        owner = cat.vendor_of(name)
        if owner not in _VENDOR_NAME:
            continue
        path = ("env", "vars", name)
        if vendor == "none":
            yield Issue(path, f"{name} is {_VENDOR_NAME[owner]}-only and this spec uses no GPUs", "remove it",
                        severity="warning")
            continue
        if owner == vendor:
            continue
        where = f"{name} is {_VENDOR_NAME[owner]}-only but this spec runs on {_VENDOR_NAME[vendor]} GPUs"
        known = cat.variables.get(name)
        if known is not None and known.harmless_on_other_vendor:
            yield Issue(path, f"{where}: harmless, {known.harmless_on_other_vendor}",
                        "keep it only if the same settings serve both vendors", severity="warning")
        else:
            reason = f": {known.conflict_on_other_vendor}" if known is not None and known.conflict_on_other_vendor else ""
            yield Issue(path, f"{where} (resources.gpu_vendor: {vendor}){reason}",
                        "remove it or move it to the other vendor's base spec")


def env_var_deprecated(s: Subject) -> Iterator[Issue]:
    """A catalogued variable that its library no longer reads (NCCL_CHECKS_DISABLE): setting it is
    harmless but does nothing, so the note says what replaced it."""
    cat = env_catalog()
    for name in s.spec.env.vars:
        var = cat.variables.get(name)
        if var is not None and var.deprecated:
            yield Issue(("env", "vars", name), f"{name} does nothing: {var.deprecated}", f"see {var.source}")


def _value_problem(var: EnvVar, value: str) -> str:
    if var.kind == "string":
        return ""
    if var.kind == "bool01":
        return "" if value in ("0", "1") else f"expected 0 or 1, got {value!r}"
    if var.kind == "enum":
        ok = value.upper() in {v.upper() for v in var.values} if var.case_insensitive else value in var.values
        return "" if ok else f"expected one of {', '.join(var.values)}, got {value!r}"
    if var.kind in ("int", "float"):
        try:
            number = int(value) if var.kind == "int" else float(value)
        except ValueError:
            return f"expected {'an integer' if var.kind == 'int' else 'a number'}, got {value!r}"
        low = var.minimum if var.minimum is not None else float("-inf")
        high = var.maximum if var.maximum is not None else float("inf")
        return "" if low <= number <= high else f"{value} is outside {low:g}..{high:g}"
    if var.kind == "tokens":
        allowed = {i.lower() for i in var.items}
        bad = [t for t in _TOKEN_SPLIT.split(value) if t and t.lower() not in allowed]
        if bad:
            return f"unknown item{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))}; allowed: {', '.join(var.items)}"
        return ""
    if var.kind == "pattern":
        return "" if re.fullmatch(var.pattern, value) else f"{value!r} does not match {var.pattern}"
    return ""


def env_var_value(s: Subject) -> Iterator[Issue]:
    """A catalogued variable has an allowed value (NCCL_DEBUG=WARN, NCCL_IB_TIMEOUT in 1..31, ...);
    each entry of mxc/compiler/data/env_vars.json cites its documentation."""
    cat = env_catalog()
    for name, raw in s.spec.env.vars.items():
        var = cat.variables.get(name)
        if var is None:
            continue
        problem = _value_problem(var, scalar_text(raw))
        if problem:
            yield Issue(("env", "vars", name), f"{name}: {problem}", f"see {var.source}")


def env_var_unknown(s: Subject) -> Iterator[Issue]:
    """A variable under a governed prefix (NCCL_, RCCL_, NVTE_, HSA_, HIP_, CUDA_, ...) that the
    curated catalog does not know: most often a typo, which the library silently ignores."""
    cat = env_catalog()
    for name in s.spec.env.vars:
        if name not in cat.variables and cat.governed(name):
            yield Issue(("env", "vars", name), f"{name} is not a known variable (a typo is silently ignored)",
                        _suggest_var(name) or "if it is real, add it to mxc/compiler/data/env_vars.json with its source")


def env_dangerous(s: Subject) -> Iterator[Issue]:
    """A variable the spec opts in to with env.allow_dangerous (LD_PRELOAD, PATH, APPTAINER_BIND, ...):
    it makes the loader, an interpreter or the container runtime load code or files, which a
    reviewer does not see in its value; reported on every check so the opt-in stays visible."""
    for name in s.spec.env.allow_dangerous:
        if name not in s.spec.env.vars:  # passed from the caller's environment (env.pass): no value to review
            yield Issue(("env", "pass", s.spec.env.pass_.index(name)), f"{name} is passed from the caller's "
                        "environment on purpose (env.allow_dangerous): whatever value it has there can load or run code",
                        "keep it only if every environment that runs this spec is trusted")
            continue
        value = scalar_text(s.spec.env.vars[name])
        yield Issue(("env", "vars", name), f"{name}={value!r} is exported on purpose (env.allow_dangerous): it can "
                    "load or run code the spec does not show", "keep it only if the value is reviewed and trusted")


def env_noted(s: Subject) -> Iterator[Issue]:
    """A variable that sends traffic or files elsewhere without loading code itself: a proxy
    (HTTPS_PROXY, all_proxy, ...: every request goes through it, Hugging Face's token included), a TLS
    trust store (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, ...) or the temporary directory (TMPDIR, TMP,
    TEMP: compilers write there what they load next). Sites need some of them, so they build; a
    reviewed one is accepted with check.accept and its reason (mxc/compiler/env_policy.py NOTED)."""
    from mxc.compiler import env_policy

    ranks = [(("env", "ranks", r, "vars"), e.vars) for r, e in s.spec.env.ranks.items()]
    for where, values in [(("env", "vars"), s.spec.env.vars), *ranks]:
        for name, raw in values.items():
            why = env_policy.noted(name)
            if why:
                yield Issue((*where, name), f"{name}={scalar_text(raw)!r}: {why}",
                            "keep it only if the site needs it; accept it with check.accept (rule env-noted) "
                            "and the reason")


def jax_platforms(s: Subject) -> Iterator[Issue]:
    """JAX_PLATFORMS names the spec's accelerator: 'rocm' on NVIDIA or 'cuda' on AMD fails at
    start-up, and 'cpu' first on a GPU spec trains at a thousandth of the speed."""
    raw = s.spec.env.vars.get("JAX_PLATFORMS")
    if raw is None:
        return
    platforms = [p.strip().lower() for p in scalar_text(raw).split(",") if p.strip()]
    vendor = s.spec.resources.gpu_vendor
    path = ("env", "vars", "JAX_PLATFORMS")
    if not platforms:
        return
    for p in platforms:
        owner = _PLATFORM_VENDOR.get(p)
        if owner and vendor != "none" and owner != vendor:
            yield Issue(path, f"JAX_PLATFORMS names '{p}' but this spec runs on {_VENDOR_NAME[vendor]} GPUs",
                        f"use {'cuda' if vendor == 'nvidia' else 'rocm'}")
        if owner and vendor == "none":
            yield Issue(path, f"JAX_PLATFORMS names '{p}' but this spec asks for no GPUs", "use cpu")
    if vendor != "none" and platforms[0] == "cpu":
        yield Issue(path, "JAX_PLATFORMS puts cpu first on a GPU spec: JAX would train on the CPU",
                    f"use {'cuda' if vendor == 'nvidia' else 'rocm'}")
