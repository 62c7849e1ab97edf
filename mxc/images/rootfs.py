"""Assemble a minimal root filesystem around a local Python 3.12, as a deterministic tarball.

Nothing can be pulled from a public registry on every machine mxc runs on, yet the CPU image
must build anywhere: it starts ``FROM scratch`` with this tarball. The tarball holds the
interpreter and its standard library (no tests, no tkinter, no bytecode caches), ``pip``, the
shared libraries they link plus the few that manylinux wheels may assume (libstdc++, libgcc_s),
``/bin/sh`` (dash) for build steps, and a small ``/etc``. Entries are sorted with fixed owners
and timestamps, so the same inputs give the same bytes and the same sha256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mxc.errors import UserError

LIBDIR = "usr/lib/x86_64-linux-gnu"
PREFIX = "usr/local"
# Libraries a manylinux wheel may link without bundling them (PEP 600's allowed set, the ones
# that exist on a glibc system), found on the host and copied whatever the interpreter links.
MANYLINUX_LIBS = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
                  "libgcc_s.so.1", "libstdc++.so.6", "libz.so.1", "libexpat.so.1")
# Parts of the standard library a training process never needs: ~200 MB of the tree.
STDLIB_SKIP = re.compile(
    r"^(test|idlelib|tkinter|turtledemo|lib2to3/tests|config-3\.\d+-[^/]*|site-packages)(/|$)|(^|/)__pycache__(/|$)"
    r"|^lib-dynload/_tkinter"
)
ETC_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
ETC_GROUP = "root:x:0:\nnogroup:x:65534:\n"


@dataclass
class Rootfs:
    """What goes into the tarball: files (archive path -> host path), symlinks, and text files."""

    python_version: str
    files: dict[str, Path] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)


def find_python(candidates: list[str] | None = None) -> Path:
    """A CPython 3.12 to copy: $MXC_IMAGE_PYTHON, the one running mxc, or the usual pyenv path."""
    options = [os.environ.get("MXC_IMAGE_PYTHON", ""), sys.executable, "/root/.pyenv/versions/3.12.1/bin/python3",
               "python3.12"] if candidates is None else candidates
    for option in options:
        if not option:
            continue
        path = shutil.which(option) or option
        try:
            out = subprocess.run([path, "-c", "import sys, sysconfig; print(sys.version_info[:2] == (3, 12), "
                                  "sysconfig.get_config_var('prefix'))"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        if out and out[0] == "True":
            return Path(path)
    raise UserError("no CPython 3.12 found to build the image's rootfs from", "set MXC_IMAGE_PYTHON=/path/to/python3.12")


def _python_prefix(python: Path) -> tuple[Path, str]:
    """The real installation prefix (not a venv's) and the X.Y version of ``python``."""
    code = "import sys, sysconfig; print(sys.base_prefix); print(sysconfig.get_python_version())"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=30).stdout.split()
    return Path(out[0]), out[1]


def _ldd(paths: list[Path]) -> dict[str, Path]:
    """Shared libraries (soname -> host file) that ``paths`` need, transitively, per ldd."""
    found: dict[str, Path] = {}
    for path in paths:
        proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60)
        for line in proc.stdout.splitlines():
            match = re.match(r"\s*(\S+) => (/\S+)", line)
            if match:
                found.setdefault(match.group(1), Path(match.group(2)))
    return found


def _host_lib(soname: str) -> Path | None:
    for base in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
        candidate = Path(base) / soname
        if candidate.exists():
            return candidate
    return None


def plan(python: Path) -> Rootfs:
    """Decide every entry of the rootfs for ``python`` (reads the host; writes nothing)."""
    prefix, version = _python_prefix(python)
    if version != "3.12":
        raise UserError(f"{python} is Python {version}; the image needs 3.12", "set MXC_IMAGE_PYTHON")
    stdlib = prefix / "lib" / f"python{version}"
    exe = prefix / "bin" / f"python{version}"
    libpython = prefix / "lib" / f"libpython{version}.so.1.0"
    if not exe.is_file() or not (stdlib / "os.py").is_file():
        raise UserError(f"{prefix} does not look like a CPython installation (no {exe.name} or os.py)")
    fs = Rootfs(python_version=version)
    fs.files[f"{PREFIX}/bin/python{version}"] = exe
    fs.links[f"{PREFIX}/bin/python3"] = f"python{version}"
    fs.links[f"{PREFIX}/bin/python"] = f"python{version}"
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib).as_posix()
        if STDLIB_SKIP.search(rel) or path.is_dir():
            continue
        fs.files[f"{PREFIX}/lib/python{version}/{rel}"] = path
    # pip (only pip) from the interpreter's own site-packages: the image installs everything else.
    site = stdlib / "site-packages"
    for top in sorted(site.glob("pip*")):
        if top.name == "pip" or re.fullmatch(r"pip-[\d.]+\.dist-info", top.name):
            for path in sorted(top.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    fs.files[f"{PREFIX}/lib/python{version}/site-packages/{path.relative_to(site).as_posix()}"] = path
    if not any("/site-packages/pip/" in name for name in fs.files):
        raise UserError(f"{python} has no pip in {site}", "install pip into that interpreter (python3.12 -m ensurepip)")
    # libpython goes where the loader looks without a cache; the interpreter's RUNPATH points at the host prefix.
    elf = [exe]
    if libpython.exists():
        fs.files[f"{LIBDIR}/{libpython.name}"] = libpython
        elf.append(libpython)
    elf += [p for p in sorted((stdlib / "lib-dynload").glob("*.so")) if not p.name.startswith("_tkinter")]
    dash = Path("/bin/dash") if Path("/bin/dash").exists() else None
    if dash is not None:
        fs.files["usr/bin/dash"] = dash
        fs.links["usr/bin/sh"] = "dash"
        elf.append(dash)
    libs = _ldd(elf)
    for soname in MANYLINUX_LIBS:
        host = _host_lib(soname)
        if host is not None:
            libs.setdefault(soname, host)
    libs.update(_ldd([p for p in libs.values() if p.exists()]))
    for soname, host in sorted(libs.items()):
        if soname.startswith("libpython") or "ld-linux" in soname:
            continue
        fs.files[f"{LIBDIR}/{soname}"] = host.resolve()
    loader = _host_lib("ld-linux-x86-64.so.2")
    if loader is None:
        raise UserError("no x86-64 dynamic loader (ld-linux-x86-64.so.2) on this host; the CPU image is x86-64 only")
    fs.files[f"{LIBDIR}/ld-linux-x86-64.so.2"] = loader.resolve()
    # The merged-/usr layout: /bin, /lib, /lib64 point into /usr, where everything lives.
    fs.links["bin"] = "usr/bin"
    fs.links["lib"] = "usr/lib"
    fs.links["lib64"] = "usr/lib64"
    fs.links["usr/lib64/ld-linux-x86-64.so.2"] = "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    fs.texts["etc/passwd"] = ETC_PASSWD
    fs.texts["etc/group"] = ETC_GROUP
    fs.texts["etc/nsswitch.conf"] = "passwd: files\ngroup: files\nhosts: files dns\n"
    for d in ("tmp", "var/tmp"):
        fs.dirs[d] = 0o1777
    for d in ("root", "proc", "sys", "dev", "etc", "opt", "usr/sbin"):
        fs.dirs.setdefault(d, 0o755)
    fs.texts["etc/mxc-rootfs.json"] = json.dumps(
        {"python": version, "from": str(prefix),
         "libraries": sorted(k.rsplit("/", 1)[-1] for k in fs.files if k.startswith(LIBDIR))},
        indent=2, sort_keys=True) + "\n"
    return fs


def _parents(name: str) -> Iterator[str]:
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        yield "/".join(parts[:i])


def write_tar(fs: Rootfs, out: Path, mtime: int = 0) -> str:
    """Write the rootfs as an uncompressed tar with sorted, normalised entries; returns its sha256."""
    dirs = dict(fs.dirs)
    for name in [*fs.files, *fs.links, *fs.texts]:
        for parent in _parents(name):
            if parent not in fs.links:
                dirs.setdefault(parent, 0o755)
    entries: list[tuple[str, str]] = [(n, "dir") for n in dirs] + [(n, "file") for n in fs.files]
    entries += [(n, "link") for n in fs.links] + [(n, "text") for n in fs.texts]
    tmp = out.with_name(f".{out.name}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as raw, tarfile.open(fileobj=_Hashing(raw, digest), mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for name, kind in sorted(entries):
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
                if kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, dirs[name]
                    tar.addfile(info)
                elif kind == "link":
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, fs.links[name], 0o777
                    tar.addfile(info)
                elif kind == "text":
                    data = fs.texts[name].encode()
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
                else:
                    host = fs.files[name]
                    st = host.stat()
                    info.size = st.st_size
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    with host.open("rb") as fh:
                        tar.addfile(info, fh)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest.hexdigest()


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes what passes through it on the way to ``raw``."""

    def __init__(self, raw: io.BufferedWriter, digest: hashlib._Hash) -> None:
        self.raw, self.digest = raw, digest

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        return self.raw.write(data)


def build_rootfs(out: Path, python: Path | None = None) -> str:
    """Assemble the rootfs tarball at ``out``; returns ``sha256:<hex>`` of the tar."""
    fs = plan(python or find_python())
    return "sha256:" + write_tar(fs, out)
