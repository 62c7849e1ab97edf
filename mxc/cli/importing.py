"""``mxc import maxtext-slurm``: a MaxText-Slurm model config (and its env files) -> an mxc spec."""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command

EXAMPLE = ("mxc import maxtext-slurm configs/llama2-70b.gpu.yml --env train_env.sh -o specs/llama2-70b.yaml\n"
           "mxc import maxtext-slurm configs/mixtral-8x22b.gpu.yml --env train_env.sh --nodes 4 \\\n"
           "    --digest sha256:<64 hex> -o specs/mixtral-8x22b.yaml")


def register(sub: Any) -> None:
    group = add_command(sub, "import", "turn another tool's job description into an mxc spec", EXAMPLE, None)

    def group_help(args: argparse.Namespace) -> int:
        group.print_help(sys.stderr)
        return 2

    group.set_defaults(handler=group_help)
    isub = group.add_subparsers(dest="import_command", metavar="FORMAT", title="formats")
    p = add_command(isub, "maxtext-slurm", "write an mxc spec from a MaxText-Slurm configs/<model>.gpu.yml and its "
                    "train_env.sh; the config file is copied beside the spec", EXAMPLE, _maxtext_slurm)
    p.add_argument("config", help="MaxText-Slurm model config, configs/<model>.gpu.yml")
    p.add_argument("--env", action="append", default=[], metavar="FILE",
                   help="env file sourced before training, e.g. train_env.sh (repeatable, later wins); "
                   "configs/<model>.env.sh beside the config is read after them when it exists")
    p.add_argument("-o", "--output", metavar="SPEC", help="spec to write (default: <model>.yaml here); the config "
                   "file is copied into its directory")
    p.add_argument("--image", default=None, metavar="REF",
                   help="container image (default: the one MaxText-Slurm's container_env.sh names)")
    p.add_argument("--digest", metavar="sha256:HEX", help="the image's manifest digest (default: left to `mxc lock`)")
    p.add_argument("--nodes", type=int, metavar="N", help="nodes (default: what the config's dcn_* parallelism asks)")
    p.add_argument("--container", choices=("podman", "apptainer"), default="podman", help="default: podman")
    p.add_argument("--force", action="store_true", help="replace a spec or config file that exists")


def _read(path: Path, what: str) -> str:
    """A regular file of bounded size, as text; UserError otherwise (a path typed by the user)."""
    from mxc.compiler.limits import MAX_FILE_BYTES
    from mxc.errors import UserError

    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{what} {path} is not a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise UserError(f"{what} {path} is larger than {MAX_FILE_BYTES:,} bytes")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _maxtext_slurm(args: argparse.Namespace) -> int:
    from mxc.compiler.loader import load_yaml
    from mxc.errors import UserError
    from mxc.importers import maxtext_slurm as ms

    config = Path(args.config)
    if not config.name.endswith(".yml"):
        raise UserError(f"{config}: expected a MaxText-Slurm model config, configs/<model>.gpu.yml",
                        "MaxText takes its config file by the .yml ending")
    text = _read(config, "model config")
    facts = ms.config_facts(load_yaml(str(config), text).data)
    stem = config.name.removesuffix(".yml").removesuffix(".gpu")
    env = ms.EnvImport()
    env_files = [Path(e) for e in args.env]
    model_env = config.with_name(f"{stem}.env.sh")
    if model_env.is_file() and all(model_env.resolve() != e.resolve() for e in env_files):
        env_files.append(model_env)
    for path in env_files:
        ms.parse_env(str(path), _read(path, "env file"), env)
    if args.nodes is not None and args.nodes < 1:
        raise UserError(f"--nodes {args.nodes}: at least 1")
    out = Path(args.output) if args.output else Path(f"{stem}.yaml")
    if not out.name.endswith((".yaml", ".yml")):
        raise UserError(f"{out}: the spec is a YAML file (.yaml)")
    name = stem if _valid_name(stem) else "imported"
    inputs = ms.SpecInputs(name=name, config_name=config.name, config_source=str(config), facts=facts, env=env,
                           image=args.image or ms.DEFAULT_IMAGE, digest=args.digest, nodes=args.nodes or facts.nodes,
                           container=args.container)
    spec = ms.spec_text(inputs)
    copied = out.parent / config.name
    same_file = copied.exists() and copied.resolve() == config.resolve()
    for target in [out] + ([] if same_file else [copied]):
        if target.exists() and not args.force:
            raise UserError(f"{target} exists", "pass --force to replace it")
    if out.resolve() == config.resolve():
        raise UserError(f"{out} is the model config itself", "name another spec file with -o")
    _write(out, spec, copied, text, not same_file, args.digest)
    print(f"mxc: wrote {out}: {len(env.vars)} variables and {len(env.xla_flags)} XLA flags from "
          f"{len(env.sources)} env file(s); {facts.keys} keys in {config.name}"
          + ("" if same_file else f" (copied to {copied})"), file=sys.stderr)
    if env.skipped:
        print(f"mxc: {len(env.skipped)} line(s) not imported, listed at the end of the spec:", file=sys.stderr)
        for skipped in env.skipped:
            print(f"  {skipped}", file=sys.stderr)
    if not args.digest:
        print(f"mxc: next: mxc lock {out} && mxc build --locked {out}", file=sys.stderr)
    print(out)
    return 0


def _valid_name(name: str) -> bool:
    import re

    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name) is not None


def _write(out: Path, spec: str, config: Path, config_text: str, install_config: bool, digest: str | None) -> None:
    """Spec and config file, or neither: written into a temporary directory beside the spec, the spec
    compiled there (so an import that would not build writes nothing), then each renamed into place."""
    from mxc import __version__
    from mxc.compiler import compile_spec
    from mxc.errors import cannot_write
    from mxc.specfiles import SpecFiles

    directory = out.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".mxc-import-", dir=directory))
    except OSError as exc:
        raise cannot_write(f"the spec into {directory}", exc) from None
    try:
        staged_spec, staged_config = tmp / out.name, tmp / config.name
        staged_spec.write_text(spec, encoding="utf-8")
        staged_config.write_text(config_text, encoding="utf-8")
        # Without a digest the spec is checked with a stand-in one: `mxc lock` fills the real one.
        sets = () if digest else ("image.digest=sha256:" + "0" * 64,)
        compile_spec(str(staged_spec), SpecFiles.for_spec(staged_spec), sets, mxc_version=__version__)
        if install_config:
            os.replace(staged_config, config)
        os.replace(staged_spec, out)
    except OSError as exc:
        raise cannot_write(str(out), exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
