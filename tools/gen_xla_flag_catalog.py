"""Regenerate mxc/compiler/data/xla_flags/jaxlib-<version>.json from an installed jaxlib.

Why not just ``strings``: the shared library holds ~550 ``xla_*`` names, but only those XLA
registers as flags are accepted in ``XLA_FLAGS`` (jaxlib aborts on any other), and strings
carry no type, default or help. So this reads XLA's own flag table:

1. A worker process makes jaxlib parse ``XLA_FLAGS`` (so the table of ``tsl::Flag`` objects
   exists), then walks that table in its own memory: name, type, default and usage text of
   every flag. The object layout is tsl's (``tsl/util/command_line_flags.h``, libstdc++);
   it is *validated*, not trusted: a flag with a bad value makes jaxlib print its usage
   (name=default, type, help) for the first few dozen flags, and every one of those must
   match what the walk found, or the tool stops.
2. Enum values come from the DebugOptions message in the ``xla/xla.proto`` descriptor
   embedded in the library (needs the ``protobuf`` package; skipped without it). They are
   shown as a hint only: flags spell them differently (``private`` for
   ``COLLECTIVES_PRIVATE_MEMORY``), so only ``--probe`` judges such values.
3. Confirmation by the real parser: all flags at their defaults in one ``XLA_FLAGS`` must be
   accepted, and every other ``xla_*`` name in the library's strings must be rejected.

4. GPU plugins (``--plugin``, optional): the CUDA and ROCm backends are separate wheels
   (``jax-cuda12-pjrt``, ``jax-rocm7-pjrt``) whose shared library carries its own copy of XLA
   and parses ``XLA_FLAGS`` again when it creates its GPU client. Their table cannot be walked
   without that GPU, so the plugin is cross-checked by name: every catalogued flag must be
   among the plugin library's ``xla_*`` strings (a flag the plugin lacks aborts a GPU run),
   and the plugin's other ``xla_*`` strings are recorded (candidates, not confirmed flags).

Run with the interpreter whose jaxlib you want catalogued:
    /tmp/setup/venv/bin/python tools/gen_xla_flag_catalog.py [--python PY] [--out DIR] \
        [--plugin jax_rocm7_pjrt-0.11.0.post1-py3-none-manylinux_2_27_x86_64.whl ...]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "mxc" / "compiler" / "data" / "xla_flags"

# tsl::Flag with libstdc++ (32-byte std::string, 32-byte std::function), see the module doc.
STRIDE = 296
OFF_TYPE = 32
OFF_DEFAULT = {"int32": (72, "<i"), "int64": (112, "<q"), "float": (152, "<f"), "bool": (192, "<?")}
OFF_STRING_DEFAULT = 232
OFF_USAGE = 264
TYPES = ("int32", "int64", "bool", "string", "float")  # tsl::Flag::Type order
NAME = re.compile(r"[a-z][a-z0-9_]{2,}")  # a few flags lack the xla_ prefix
USAGE_LINE = re.compile(r"^\t--(xla_[a-z0-9_]+)=(.*?)\s*\t(bool|int32|int64|float|string)\t(.*)$")


def _probe_env(flags: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return {**env, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def run_jax(python: str, flags: str) -> subprocess.CompletedProcess[str]:
    """Start jax with ``XLA_FLAGS=flags``: the real flag parser."""
    return subprocess.run([python, "-c", "import jax; jax.devices()"], env=_probe_env(flags),
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- worker (runs in the target venv)

def _worker_flags(first_name: str, xla_flags: str) -> None:
    """Walk the tsl::Flag table of this process and print it as JSON."""
    os.environ.update(_probe_env(xla_flags))  # any accepted flag: makes jaxlib build its table
    import jax

    jax.devices()
    mem = open("/proc/self/mem", "rb", 0)  # noqa: SIM115 - read for the life of the worker

    def read(addr: int, n: int) -> bytes:
        mem.seek(addr)
        return mem.read(n)

    def std_string(addr: int) -> str:
        ptr, size = struct.unpack("<QQ", read(addr, 16))
        if size > 1 << 20:
            raise ValueError("not a string")
        return read(ptr, size).decode("utf-8")

    def name_at(addr: int) -> str | None:
        try:
            text = std_string(addr)
        except (OSError, ValueError, OverflowError):
            return None
        return text if NAME.fullmatch(text) else None

    needle = first_name.encode() + b"\0"
    blobs: list[tuple[int, bytes]] = []
    for line in open("/proc/self/maps"):  # noqa: SIM115
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if parts[1].startswith("rw") and (len(parts) == 5 or parts[5] == "[heap]"):
            try:
                blobs.append((lo, read(lo, hi - lo)))
            except OSError:
                continue
    bases = []
    for lo, data in blobs:
        for hit in re.finditer(re.escape(needle), data):
            packed = struct.pack("<QQ", lo + hit.start(), len(first_name))
            for lo2, data2 in blobs:
                at = data2.find(packed)
                while at >= 0:
                    if at % 8 == 0:
                        bases.append(lo2 + at)
                    at = data2.find(packed, at + 1)
    if not bases:
        sys.exit(f"could not find the flag object of {first_name}")

    def flag_at(addr: int) -> dict[str, Any] | None:
        name = name_at(addr)
        if name is None:
            return None
        code = struct.unpack("<i", read(addr + OFF_TYPE, 4))[0]
        if not 0 <= code < len(TYPES):
            return None
        kind = TYPES[code]
        try:
            if kind == "string":
                default: Any = std_string(addr + OFF_STRING_DEFAULT)
            else:
                off, fmt = OFF_DEFAULT[kind]
                default = struct.unpack(fmt, read(addr + off, struct.calcsize(fmt)))[0]
            doc = std_string(addr + OFF_USAGE)
        except (OSError, ValueError, UnicodeDecodeError, OverflowError):
            return None
        return {"name": name, "type": kind, "default": default, "doc": doc}

    # Copies of the table can exist (a vector that grew leaves its old storage behind):
    # walk from every copy and keep the longest consistent run.
    flags: list[dict[str, Any]] = []
    for base in bases:
        start = base
        while flag_at(start - STRIDE) is not None:
            start -= STRIDE
        run = []
        addr = start
        while (flag := flag_at(addr)) is not None:
            run.append(flag)
            addr += STRIDE
        if len(run) > len(flags):
            flags = run
    json.dump(flags, sys.stdout)


def _worker_descriptor(lib: str) -> None:
    """Print enum choices of DebugOptions fields, from the xla.proto descriptor in ``lib``."""
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped,unused-ignore]

    with open(lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(b"\n\rxla/xla.proto")
        if start < 0:
            json.dump({}, sys.stdout)
            return
        end = _message_end(data, start)
        fd = descriptor_pb2.FileDescriptorProto()
        fd.ParseFromString(bytes(data[start:end]))
    debug = next(m for m in fd.message_type if m.name == "DebugOptions")
    enums = {e.name: [v.name for v in e.value] for e in debug.enum_type}
    out = {}
    for field in debug.field:
        if field.type == field.TYPE_ENUM:
            choices = enums.get(field.type_name.rsplit(".", 1)[-1])
            if choices:
                out[field.name] = {"proto_enum": choices, "list": field.label == field.LABEL_REPEATED}
    json.dump(out, sys.stdout)


def _message_end(data: Any, start: int) -> int:
    """Where a serialized FileDescriptorProto that starts at ``start`` ends (fields 1..20)."""
    pos = start

    def varint(p: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            byte = data[p]
            p += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, p

    while True:
        key, nxt = varint(pos)
        number, wire = key >> 3, key & 7
        if not 1 <= number <= 20 or wire not in (0, 2):
            return pos
        if wire == 0:
            _, nxt = varint(nxt)
        else:
            length, nxt = varint(nxt)
            nxt += length
        pos = nxt


# ---------------------------------------------------------------- driver

def usage_dump(python: str, int_flag: str) -> dict[str, tuple[str, str, str]]:
    """name -> (displayed default, type, help) for the flags jaxlib prints on a parse error."""
    proc = run_jax(python, f"--{int_flag}=not-a-number")
    if proc.returncode == 0:
        sys.exit(f"jaxlib accepted --{int_flag}=not-a-number; cannot read its usage")
    out: dict[str, tuple[str, str, str]] = {}
    for line in proc.stderr.splitlines():
        m = USAGE_LINE.match(line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return out


def displayed(flag: dict[str, Any]) -> str:
    """A default as tsl prints it in the usage text."""
    value = flag["default"]
    if flag["type"] == "bool":
        return "true" if value else "false"
    if flag["type"] == "float":
        return f"{value:f}"
    if flag["type"] == "string":
        return f'"{value}"'
    return str(value)


def library_names(lib: Path) -> set[str]:
    with open(lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return {m.decode() for m in re.findall(rb"(?<![A-Za-z0-9_])(xla_[a-z0-9_]+)", data)}


def unknown_in(stderr: str) -> set[str]:
    found = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", stderr)
    return {tok.lstrip("-").split("=", 1)[0] for tok in found.group(1).split()} if found else set()


def token(flag: dict[str, Any]) -> str:
    """``--name=default`` as XLA_FLAGS takes it (strings double-quoted)."""
    text = displayed(flag)
    if flag["type"] == "float":
        text = repr(flag["default"])
    return f"--{flag['name']}={text}"


def confirm_names(python: str, flags: dict[str, dict[str, Any]]) -> None:
    """Every catalogued flag at its default in one XLA_FLAGS must be accepted.

    A few defaults cannot be fed back (``--xla_fuel=""`` is rejected as a value); the parser
    naming such a flag in its value error has recognised the name, which is all we confirm.
    """
    def check(group: list[dict[str, Any]]) -> None:
        proc = run_jax(python, " ".join(token(f) for f in group))
        if proc.returncode == 0:
            return
        if "Unknown flag" in proc.stderr:
            sys.exit(f"jaxlib does not know some catalogued flags: {sorted(unknown_in(proc.stderr))}")
        if len(group) == 1:
            return  # the parser rejected the value, so it knows the name
        half = len(group) // 2
        check(group[:half])
        check(group[half:])

    check(list(flags.values()))


def plugin_check(plugin: Path, flags: set[str], jaxlib_names: set[str]) -> dict[str, Any]:
    """Cross-check a GPU plugin (its wheel or its .so) by name against the catalogued flags."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = plugin
        if plugin.suffix == ".whl":
            with zipfile.ZipFile(plugin) as wheel:
                members = [m for m in wheel.namelist() if m.startswith("jax_plugins/") and m.endswith(".so")]
                if len(members) != 1:
                    sys.exit(f"{plugin.name}: expected one jax_plugins/*.so, found {members}")
                lib = Path(wheel.extract(members[0], tmp))
        names = library_names(lib)
    missing = sorted(flags - names)
    if missing:
        print(f"warning: {plugin.name} lacks {len(missing)} catalogued flags: {missing[:10]}", file=sys.stderr)
    return {"flags_missing": missing, "other_xla_names": sorted(names - flags - jaxlib_names)}


def generate(python: str, out_dir: Path, plugins: tuple[Path, ...] = ()) -> Path:
    info = subprocess.run(
        [python, "-c", "import jaxlib, jaxlib.version, os; print(os.path.dirname(jaxlib.__file__)); "
                       "print(jaxlib.version.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")
    lib, version = Path(info[0]) / "libjax_common.so", info[1].strip()
    names = library_names(lib)
    # An int flag for the usage dump: any name the parser rejects a non-number for.
    dump: dict[str, tuple[str, str, str]] = {}
    for candidate in ("xla_backend_optimization_level", "xla_gpu_autotune_level", "xla_force_host_platform_device_count"):
        if candidate in names:
            dump = usage_dump(python, candidate)
            if dump:
                break
    if not dump:
        sys.exit("no usage dump: none of the known int flags exists in this jaxlib")
    first = next(iter(dump))
    first_default = dump[first][0].strip('"')
    walk = subprocess.run([python, __file__, "--worker-flags", first, f"--{first}={first_default}"], env=_probe_env(""),
                          capture_output=True, text=True, timeout=300)
    if walk.returncode != 0:
        sys.exit(f"flag table walk failed:\n{walk.stderr[-2000:]}")
    flags = {f["name"]: f for f in json.loads(walk.stdout)}
    # Validate the walk against what jaxlib itself printed. jaxlib's log line has a length
    # cap, so the last usage line it prints can be cut inside its help text (0.8.2, 0.11.x).
    last = next(reversed(dump))
    for name, (default, kind, doc) in dump.items():
        got = flags.get(name)
        cut = name == last and got is not None and got["doc"].startswith(doc)
        if got is None or got["type"] != kind or displayed(got) != default or (
                got["doc"] != doc and "\n" not in got["doc"] and not cut):
            sys.exit(f"flag table layout mismatch at {name}: jaxlib says {default!r} {kind}, walk says {got}; "
                     "update the layout constants in this tool")
    desc = subprocess.run([python, __file__, "--worker-descriptor", str(lib)], capture_output=True, text=True)
    choices = json.loads(desc.stdout) if desc.returncode == 0 and desc.stdout else {}
    # Confirmation by the real parser.
    confirm_names(python, flags)
    others = sorted(names - set(flags))
    rejected = unknown_in(run_jax(python, " ".join(f"--{n}=0" for n in others)).stderr) if others else set()
    accepted_extra = sorted(set(others) - rejected)
    if accepted_extra:
        sys.exit(f"XLA_FLAGS accepts names the table walk missed: {accepted_extra}")
    catalog = {
        "jaxlib_version": version,
        "generated_by": "tools/gen_xla_flag_catalog.py",
        "method": "tsl::Flag table of libjax_common.so, validated against jaxlib's usage text; "
                  "all flags accepted by XLA_FLAGS at their defaults, every other xla_* name in the library rejected",
        "rejected_names": len(others),
        "plugins": {p.name: plugin_check(p, set(flags), names) for p in plugins},
        "flags": {
            name: {
                "type": f["type"],
                "default": f["default"] if f["type"] != "float" else float(f"{f['default']:.7g}"),
                "doc": f["doc"].strip(),
                **choices.get(name, {}),
            }
            for name, f in sorted(flags.items())
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"jaxlib-{version}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(f"{len(flags)} flags of jaxlib {version} ({len(others)} other xla_* names rejected) -> {out}")
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker-flags":
        _worker_flags(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--worker-descriptor":
        _worker_descriptor(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose jaxlib is catalogued")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--plugin", type=Path, action="append", default=[],
                        help="a GPU plugin wheel (jax-cuda12-pjrt, jax-rocm7-pjrt) or its .so to cross-check")
    args = parser.parse_args()
    generate(args.python, args.out, tuple(args.plugin))


if __name__ == "__main__":
    main()
