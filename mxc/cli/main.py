"""``mxc``: argument parsing and the one place errors become exit codes.

Command modules register their subcommands; each imports what it needs inside its
handler, so ``mxc --help`` and ``mxc build`` never pay for jax, ray or maxtext.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Generator, Sequence

from mxc import __version__

# One module per group of commands; each has register(subparsers).
COMMAND_MODULES = ("mxc.cli.bundles", "mxc.cli.runs", "mxc.cli.slurm_cmds", "mxc.cli.watch", "mxc.cli.wait", "mxc.cli.lock",
                   "mxc.cli.check", "mxc.cli.triage", "mxc.cli.observe", "mxc.cli.completion",
                   "mxc.cli.housekeeping", "mxc.cli.stacks", "mxc.cli.importing",
                   "mxc.remote.commands")  # last: it adds --cluster to commands registered before it
# Commands mxc calls itself (over ssh, mxc/remote/agent.py), not users: left out of mxc --help's list.
HIDDEN_COMMANDS = frozenset({"remote-agent"})

DESCRIPTION = """\
Compile MaxText training job specs into immutable, hash-addressed bundles, and run them.

  mxc build specs/tiny.yaml     compile a spec; prints the bundle hash last
  mxc ls                        bundles in the store ($MXC_HOME, default ~/.mxc)
  mxc show 3f9a                 a bundle by any unique hash prefix
  mxc diff A B                  what differs between two specs or bundles
  mxc verify 3f9a               recompute every hash of a stored bundle
  mxc schema                    the spec's JSON Schema (editors: yaml-language-server), --record the run record's
  mxc check specs/              XLA/NCCL flags, MaxText overrides and rules; --probe, --matrix
  mxc flags --search latency    the XLA flag catalog of the pinned jaxlib
  mxc lock specs/70b.yaml       pin image digest, code commit, Python hashes in lockfiles/
  mxc build --locked SPEC       build with exactly the locked pins, refuse anything else
  mxc image build images/maxtext-cpu   build an image target, print its digest
  mxc run [3f9a]                train a bundle (default: the last built), with restarts
  mxc runs                      recorded runs: status, steps, last loss, duration
  mxc rerun RUN-ID              the same bundle again, exactly; warns on drift
  mxc logs [RUN-ID] [-f]        a run's training log
  mxc cancel RUN-ID             stop a run (Slurm: scancel, no requeue); a lost run: end what is left
  mxc watch [RUN-ID] [--once]   keep Slurm runs' records current: state, alerts, resubmission
  mxc wait RUN-ID               block until a run ends; exit with its status (mxc run --wait: the same)
  mxc metrics RUN [--query Q]   a run's Prometheus TSDB, live or long after (observability on)
  mxc report RUN [RUN2...]      one HTML file: interactive plots, verdicts, spec diff, drift
  mxc dashboard RUN             Prometheus + TensorBoard on a run's data (127.0.0.1)
  mxc stacks [RUN-ID]           every rank's Python/native stacks of a live run (py-spy), undisturbed
  mxc triage [RUN-ID]           why a run failed: cause, first failing rank and node, what to try
  mxc compare RUN-A RUN-B       spec diff, environment drift, first diverging step, step-time ratio
  mxc notify test               send a test alert to the spec's webhook (Slack, Mattermost, Telegram)
  mxc completion bash|zsh|fish  a shell completion script (commands, options, run ids, bundle prefixes)
  mxc gc --older-than 30d       what old runs, bundles, code and images would go (--yes removes them)
  mxc rm RUN|BUNDLE...          remove named runs and bundles (never a live run)
  mxc import maxtext-slurm CONFIG.gpu.yml --env train_env.sh   a MaxText-Slurm config as an mxc spec
  mxc cluster add hpc alice@login      a cluster profile; then mxc run|runs|logs|wait|cancel|... --cluster hpc

Exit codes: 0 success, 1 a check found a difference or a problem, 2 bad input.
"""


class _TopHelp(argparse.RawDescriptionHelpFormatter):
    """``mxc --help``: DESCRIPTION lists every command once, with an example; argparse's own list
    of the subcommands (each again, with its one-line help) is left out."""

    def _iter_indented_subactions(self, action: argparse.Action) -> Generator[argparse.Action, None, None]:
        yield from ()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mxc", description=DESCRIPTION, formatter_class=_TopHelp)
    parser.add_argument("--version", action="version", version=f"mxc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                help="one of the commands above; `mxc COMMAND --help` shows its options and an example")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)  # what --cluster sends on (mxc/remote/commands.py)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    from mxc.compiler.errors import SpecErrors
    from mxc.errors import UserError

    try:
        code: int = args.handler(args)
        return code
    except SpecErrors as exc:
        for err in exc.errors:
            print(err, file=sys.stderr)
        n = len(exc.errors)
        print(f"mxc: {n} problem{'s' if n != 1 else ''} in the spec; nothing was written", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"mxc: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("mxc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a write path that has no message of its own for a full disk
        from mxc.errors import cannot_write, no_room

        if not no_room(exc):
            raise
        print(f"mxc: error: {cannot_write(str(exc.filename or 'a file'), exc)}", file=sys.stderr)
        return 1
