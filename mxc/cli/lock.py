"""Environment commands: ``mxc lock`` (pin a spec's image, code and Python packages) and
``mxc image build|check`` (the images/ targets)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json


def register(sub: Any) -> None:
    p = add_command(sub, "lock", "resolve a spec's image tag, code branch and Python requirements into lockfiles/",
                    "mxc lock specs/70b.yaml            # writes lockfiles/70b.lock.json\n"
                    "mxc lock --check specs/70b.yaml    # exit 1 if the lock is out of date\n"
                    "mxc build --locked specs/70b.yaml  # build with exactly those pins", _lock)
    p.add_argument("spec", help="spec file (YAML)")
    p.add_argument("--requirements", metavar="FILE",
                   help="hashed requirements of the run environment (default: lockfiles/requirements-<target>.txt)")
    p.add_argument("--lockfile", metavar="FILE", help="where the lock goes (default: lockfiles/<spec name>.lock.json)")
    _add_insecure(p)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the lock would change")
    add_json(p)

    image = add_command(sub, "image", "build and check the container images of images/",
                        "mxc image build images/maxtext-cpu\nmxc image check images/*", None)

    def image_help(args: argparse.Namespace) -> int:
        image.print_help(sys.stderr)
        return 2

    image.set_defaults(handler=image_help)
    isub = image.add_subparsers(dest="image_command", metavar="COMMAND", title="commands")
    p = add_command(isub, "build", "build an image target with Podman (or Apptainer) and print its digest",
                    "mxc image build images/maxtext-cpu\n"
                    "mxc image build images/maxtext-cpu --push 127.0.0.1:5000/ml/maxtext-cpu:v1\n"
                    "mxc image build --builder apptainer -o maxtext-rocm.sif images/maxtext-rocm", _image_build)
    p.add_argument("target", help="image directory (images/maxtext-cpu, images/maxtext-rocm, ...)")
    p.add_argument("--builder", choices=("podman", "apptainer"), default="podman", help="default: podman")
    p.add_argument("--tag", help="local tag (podman; default localhost/mxc/<name>:latest)")
    p.add_argument("--base", metavar="REF", help="base image instead of image.toml's (a tag is resolved to a digest)")
    p.add_argument("-o", "--output", metavar="SIF", help="output file (apptainer; default <name>.sif)")
    p.add_argument("--push", metavar="REGISTRY/NAME:TAG", help="push the image there and print the registry's digest")
    _add_insecure(p)
    add_json(p)

    p = add_command(isub, "check", "check image targets through spython: pinned base, hashed installs, files agree",
                    "mxc image check images/maxtext-cpu images/maxtext-rocm images/maxtext-cuda", _image_check)
    p.add_argument("targets", nargs="+", help="image directories")
    add_json(p)


def _add_insecure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--insecure-registry", dest="insecure", action="append", default=[], metavar="HOST[:PORT]",
                   help="talk plain HTTP to this registry (loopback registries always are)")


def _lock(args: argparse.Namespace) -> int:
    from mxc.fsutil import write_atomic
    from mxc.lock.make import make_lock
    from mxc.lock.paths import shown

    locked = make_lock(args.spec, requirements=args.requirements, lockfile=args.lockfile,
                       insecure=frozenset(args.insecure))
    path = locked.path
    old_text = path.read_text("utf-8") if path.is_file() else None
    changed = old_text != locked.text
    if not args.check and changed:
        write_atomic(path, locked.text)
    if args.json:
        print_json({"lockfile": shown(path), "changed": changed, "written": changed and not args.check,
                    "bundle": locked.bundle.hash, "lock": json.loads(locked.text)})
    else:
        old = _old_lock(old_text)
        lock = locked.lock
        if lock.image is not None:
            was = old.get("image", {}).get("digest")
            note = f" (was {was})" if was and was != lock.image.digest else ""
            how = " (pinned in the spec: no registry asked)" if lock.image.source == "spec" else ""
            print(f"image   {lock.image.ref} -> {lock.image.digest}{note}{how}")
        if lock.code.commit is not None:
            was = old.get("code", {}).get("commit")
            note = f" (was {was})" if was and was != lock.code.commit else ""
            source = f"{lock.code.repo} {lock.code.ref}" if lock.code.ref else f"{lock.code.repo}"
            print(f"code    {source} -> {lock.code.commit}{note}")
        elif lock.code.maxtext_version is not None:
            print(f"code    maxtext=={lock.code.maxtext_version}")
        if lock.python is not None:
            print(f"python  {lock.python.requirements}: {len(lock.python.packages)} packages, sha256 {lock.python.sha256[:12]}")
        print(f"bundle  {locked.bundle.hash} (mxc build --locked {args.spec})")
        state = ("out of date" if args.check else "updated") if changed else "up to date"
        print(f"{shown(path)}: {state}")
    return 1 if args.check and changed else 0


def _old_lock(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _image_build(args: argparse.Namespace) -> int:
    from mxc.images.build import build_image
    from mxc.images.recipes import load_target

    target = load_target(args.target)
    print(f"{target.name}: building with {args.builder} (a few minutes the first time)", file=sys.stderr)
    built = build_image(target, builder=args.builder, tag=args.tag, base=args.base,
                        output=Path(args.output) if args.output else None, push=args.push,
                        insecure=frozenset(args.insecure))
    from mxc.fsutil import mxc_home, write_json_atomic

    # The digest recorded where later commands (and people) can find it: $MXC_HOME/images/<name>.json.
    write_json_atomic(mxc_home() / "images" / f"{built.name}.json", built.__dict__)
    if args.json:
        print_json(built.__dict__)
        return 0
    if built.base:
        print(f"base    {built.base}", file=sys.stderr)
    if built.rootfs_sha256:
        print(f"rootfs  {built.rootfs_sha256}", file=sys.stderr)
    print(f"image   {built.tag}", file=sys.stderr)
    if built.pushed:
        print(f"pushed  {built.pushed}@{built.pushed_digest}", file=sys.stderr)
        print(built.pushed_digest)
    else:
        print(built.digest)
    return 0


def _image_check(args: argparse.Namespace) -> int:
    from mxc.images.recipes import check_target, load_target

    report = {t: check_target(load_target(t)) for t in args.targets}
    if args.json:
        print_json({t: {"ok": not p, "problems": p} for t, p in report.items()})
    else:
        for target, problems in report.items():
            for problem in problems:
                print(problem)
            if not problems:
                print(f"{target}: ok")
    return 1 if any(report.values()) else 0
