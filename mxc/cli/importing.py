"""``mxc import maxtext-slurm``: a MaxText-Slurm model config (and its env files) -> an mxc spec."""

from __future__ import annotations

import argparse
import os
import re
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


def _read(path: Path, what: str) -> tuple[str, int]:
    """The text and permission bits of a regular file of bounded size, confined like ``extends``: read
    only when it resolves inside its own repository (the git work tree holding it, else its directory),
    so a configs/<model>.env.sh or a config that is a symlink to ~/.ssh/id_rsa is refused before a
    byte of it is read (mxc/specfiles.py). UserError otherwise (a path typed by the user)."""
    from mxc.compiler.resolve import ReadRefused
    from mxc.errors import UserError
    from mxc.specfiles import SpecFiles

    try:
        data = SpecFiles.for_spec(path)(str(path))
        mode = stat.S_IMODE(os.stat(os.path.realpath(path)).st_mode)
    except ReadRefused as exc:
        raise UserError(f"{what} {path}: {exc.message}",
                        "the importer reads only files of the config's repository (regular files, no symlink out)"
                        ) from None
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8"), mode
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None


def _private_bits(modes: list[int]) -> int:
    """The mode of a new file (0666 less the umask) less the group and other permissions any of
    ``modes`` lacks: a copy, or a spec holding lines of a file, is no more readable than what it
    came from (a 0600 config is copied as 0600; 0644 only when the source was world-readable)."""
    umask = os.umask(0o022)
    os.umask(umask)
    base = 0o666 & ~umask
    for mode in modes:
        base &= mode | 0o700
    return (base | 0o600) & 0o666


def _maxtext_slurm(args: argparse.Namespace) -> int:
    from mxc.compiler.errors import printable
    from mxc.compiler.loader import load_yaml
    from mxc.compiler.schema import CONFIG_FILE_PATTERN
    from mxc.errors import UserError
    from mxc.importers import maxtext_slurm as ms

    config = Path(args.config)
    if not config.name.endswith(".yml"):
        raise UserError(f"{config}: expected a MaxText-Slurm model config, configs/<model>.gpu.yml",
                        "MaxText takes its config file by the .yml ending")
    if not re.fullmatch(CONFIG_FILE_PATTERN, config.name):
        raise UserError(f"{config}: the config's name becomes model.config_file, which takes letters, digits, "
                        "'.', '_' and '-'", "rename (or copy) the config file")
    text, config_mode = _read(config, "model config")
    facts = ms.config_facts(load_yaml(str(config), text).data)
    stem = config.name.removesuffix(".yml").removesuffix(".gpu")
    env = ms.EnvImport()
    env_files = [Path(e) for e in args.env]
    model_env = config.with_name(f"{stem}.env.sh")
    if os.path.lexists(model_env) and all(model_env.resolve() != e.resolve() for e in env_files):
        print(printable(f"mxc: reading {model_env} too: MaxText-Slurm's launcher sources it after the --env "
                        "files"), file=sys.stderr)
        env_files.append(model_env)
    env_modes = []
    for path in env_files:
        env_text, mode = _read(path, "env file")
        ms.parse_env(str(path), env_text, env)
        env_modes.append(mode)
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
    _write(out, (spec, _private_bits(env_modes)), copied, (text, _private_bits([config_mode])), not same_file,
           args.digest)
    print(f"mxc: wrote {out}: {len(env.vars)} variables and {len(env.xla_flags)} XLA flags from "
          f"{len(env.sources)} env file(s); {facts.keys} keys in {config.name}"
          + ("" if same_file else f" (copied to {copied})"), file=sys.stderr)
    if env.skipped:
        print(f"mxc: {len(env.skipped)} line(s) not imported, listed at the end of the spec:", file=sys.stderr)
        for skipped in env.skipped:
            print(printable(f"  {skipped}"), file=sys.stderr)  # lines of the files: no terminal escapes
    if not args.digest:
        print(f"mxc: next: mxc lock {out} && mxc build --locked {out}", file=sys.stderr)
    print(out)
    return 0


def _valid_name(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name) is not None


def _write(out: Path, spec: tuple[str, int], config: Path, config_file: tuple[str, int], install_config: bool,
           digest: str | None) -> None:
    """Spec and config file (each text and mode), or neither: written into a temporary directory beside
    the spec, the spec compiled there (so an import that would not build writes nothing), then each
    renamed into place."""
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
        for staged, (text, mode) in ((staged_spec, spec), (staged_config, config_file)):
            staged.write_text(text, encoding="utf-8")
            staged.chmod(mode)
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
