"""CLI: ``mxc cluster add|ls|rm|check|push`` and ``--cluster NAME`` on the commands a laptop runs remotely.

Registered after every other command module (mxc/cli/main.py), so that it can add ``--cluster`` to
the existing parsers: with it, a command's handler is this module's, which sends the same command
to the cluster's login node (``remote-agent run``) instead of running it here. The words sent are
the command line as typed minus ``--cluster NAME``; ``run`` is rebuilt around the full bundle hash
(after the bundle was copied), ``report`` makes its file there and writes it here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, table

# Commands that take --cluster, with an example each for their --help.
FORWARDED = {
    "run": "mxc run --cluster hpc 3f9a -y      # copies the bundle if the cluster lacks it, submits there",
    "runs": "mxc runs --cluster hpc",
    "logs": "mxc logs --cluster hpc RUN -f",
    "wait": "mxc wait --cluster hpc RUN && echo trained",
    "cancel": "mxc cancel --cluster hpc RUN",
    "triage": "mxc triage --cluster hpc RUN",
    "report": "mxc report --cluster hpc RUN -o report.html   # made there, written here",
    "metrics": "mxc metrics --cluster hpc RUN --query 'rate(mxc_train_step_total[1m])'",
    "watch": "mxc watch --cluster hpc --once",
}
CLUSTER_OPTION = "--cluster"


def register(sub: Any) -> None:
    p = add_command(sub, "cluster", "cluster profiles for running from a laptop over SSH: add, ls, rm, check, push "
                    "(docs/remote.md)",
                    "mxc cluster add hpc alice@login.hpc.example.org --runs-dir '$SCRATCH/mxc-runs'\n"
                    "mxc cluster check hpc\nmxc run --cluster hpc 3f9a -y ; mxc logs --cluster hpc RUN -f", _usage)
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION", title="actions")
    a = add_command(csub, "add", "add (or with --replace, change) a cluster profile: the login node and the mxc there",
                    "mxc cluster add hpc alice@login.hpc.example.org\n"
                    "mxc cluster add hpc hpc-login --mxc '/opt/mxc/.venv/bin/mxc' --runs-dir '$SCRATCH/mxc-runs'\n"
                    "# LOGIN is what you give ssh: user@host or a Host alias of ~/.ssh/config (ports, ProxyJump)",
                    _add)
    a.add_argument("name", help="the profile's name (letters, digits, '.', '_', '-')")
    a.add_argument("login", help="the ssh destination of the login node: user@host or a Host alias of your ssh config")
    a.add_argument("--mxc", metavar="COMMAND", help="how mxc runs on the login node, e.g. /opt/mxc/bin/mxc or "
                   "'python3 -m mxc' (default: mxc, found on the login shell's PATH)")
    a.add_argument("--home", metavar="PATH", help="MXC_HOME there: its bundle store (default: ~/.mxc there); "
                   "absolute, ~/..., or $VAR/... expanded there")
    a.add_argument("--runs-dir", metavar="PATH", help="MXC_RUNS_DIR there: where runs and checkpoints go (default: "
                   "$MXC_HOME/runs there), e.g. '$SCRATCH/mxc-runs' (quoted: expanded there, not here)")
    a.add_argument("--replace", action="store_true", help="replace a profile of that name")
    a.add_argument("--check", action="store_true", help="then connect and check it, as `mxc cluster check`")
    add_json(a)

    ls = add_command(csub, "ls", "list cluster profiles", "mxc cluster ls\nmxc cluster ls --json", _ls)
    add_json(ls)

    rm = add_command(csub, "rm", "remove a cluster profile (and close its shared SSH connection)",
                     "mxc cluster rm hpc", _rm)
    rm.add_argument("name")

    c = add_command(csub, "check", "connect to a cluster's login node: SSH, the mxc there and its version (must "
                    "match this one), sbatch, its store and runs root; exit 1 when something is missing",
                    "mxc cluster check hpc\nmxc cluster check hpc --json", _check)
    c.add_argument("name")
    add_json(c)

    push = add_command(csub, "push", "copy a bundle to a cluster's store unless it holds it already (mxc run "
                       "--cluster does this first)", "mxc cluster push hpc 3f9a\nmxc cluster push hpc @ --json", _push)
    push.add_argument("name")
    push.add_argument("bundle", nargs="?", help="bundle hash or prefix, @, @~N or label:NAME (default: @)")
    add_json(push)

    from mxc.remote import agent

    agent.register(sub)
    for name, example in FORWARDED.items():
        _hook(sub, name, example)


def _hook(sub: Any, name: str, example: str) -> None:
    """``--cluster NAME`` on command ``name``: with it, the command runs on that cluster's login node."""
    parser = sub.choices.get(name)
    if parser is None:  # not a command of this mxc
        return
    local = parser.get_default("handler")
    parser.add_argument(CLUSTER_OPTION, metavar="NAME",
                        help="run it on that cluster's login node over SSH (a profile of `mxc cluster add`; docs/remote.md)")
    remote = {"run": _run, "report": _report}.get(name, _forwarded)

    def handler(args: argparse.Namespace) -> int:
        return int(remote(args) if args.cluster is not None else local(args))

    parser.set_defaults(handler=handler)
    parser.epilog = (parser.epilog or "") + "\n  " + example


def _usage(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    raise UserError("mxc cluster: which action?", "add, ls, rm, check or push; mxc cluster --help")


# ---- profiles


def _add(args: argparse.Namespace) -> int:
    from mxc.remote import profiles

    cluster = profiles.make(args.name, args.login, args.mxc, args.home, args.runs_dir)
    replaced = profiles.add(cluster, args.replace)
    if not args.json:
        print(shown(f"mxc: cluster {cluster.name} {'replaced' if replaced else 'added'}: {cluster.login} "
                    f"({profiles.path()})"), file=sys.stderr)
    if args.check:
        return _checked(cluster, args.json)
    if args.json:
        print_json({"name": cluster.name, **cluster.as_dict()})
    return 0


def _ls(args: argparse.Namespace) -> int:
    from mxc.remote import profiles

    clusters = profiles.load()
    if args.json:
        print_json([{"name": c.name, **c.as_dict()} for c in clusters.values()])
        return 0
    if not clusters:
        print("no clusters yet: mxc cluster add NAME user@login", file=sys.stderr)
        return 0
    rows = [[c.name, c.login, " ".join(c.mxc), c.home or "-", c.runs_dir or "-"] for c in clusters.values()]
    print(table(rows, ["NAME", "LOGIN", "MXC", "HOME", "RUNS DIR"]))
    return 0


def _rm(args: argparse.Namespace) -> int:
    from mxc.remote import profiles, ssh

    cluster = profiles.remove(args.name)
    closed = ssh.disconnect(cluster)
    print(shown(f"mxc: cluster {cluster.name} removed ({cluster.login})" + ("; its shared connection closed" if closed
                                                                              else "")), file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    from mxc.remote import profiles

    return _checked(profiles.get(args.name), args.json)


def _checked(cluster: Any, as_json: bool) -> int:
    import time

    from mxc import __version__
    from mxc.remote import client

    started = time.monotonic()
    info = client.probe(cluster, check_version=False)
    seconds = time.monotonic() - started
    matches = info.get("version") == __version__
    problems = ([] if matches else [f"mxc there is {info.get('version')}, here {__version__}: install mxc "
                                    f"{__version__} there (every --cluster command refuses until they match)"])
    if not info.get("sbatch"):
        problems.append("no sbatch on the login shell's PATH there: Slurm runs cannot be submitted")
    if as_json:
        print_json({"cluster": cluster.name, "login": cluster.login, "seconds": round(seconds, 3),
                    "version_matches": matches, "local_version": __version__, "problems": problems, **info})
    else:
        print(shown(f"cluster {cluster.name}: {cluster.login} ({info.get('host')}) answered in {seconds:.1f}s"))
        print(shown(f"  mxc      {info.get('version')} ({'matches' if matches else 'differs from ' + __version__}), "
                    f"{info.get('executable')}, Python {info.get('python')}"))
        print(shown(f"  sbatch   {info.get('sbatch') or 'not found'}"))
        print(shown(f"  store    {info.get('home')}"))
        print(shown(f"  runs     {info.get('runs')}"))
        for problem in problems:
            print(shown(f"mxc: problem: {problem}"), file=sys.stderr)
    return 1 if problems else 0


def _push(args: argparse.Namespace) -> int:
    from mxc.cli.common import store
    from mxc.remote import client, profiles

    cluster = profiles.get(args.name)
    st = store()
    bundle = st.get(args.bundle) if args.bundle else st.current()
    st.require_intact(bundle)
    transfer = client.push(cluster, bundle)
    if args.json:
        print_json(transfer.as_dict())
    else:
        print(transfer.line(), file=sys.stderr)
    return 0


# ---- commands run there


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--opt V``, ``--opt=V``, or an abbreviation argparse
    accepted: a prefix of ``option``; an ambiguous one never parsed). Nothing after ``--`` is touched."""
    out: list[str] = []
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token == "--":
            out.extend(argv[i:])
            break
        name, eq, _ = token.partition("=")
        if name.startswith("--") and len(name) > 2 and option.startswith(name):
            skip = not eq
            continue
        out.append(token)
    return out


def _cluster(args: argparse.Namespace) -> Any:
    from mxc.remote import profiles

    return profiles.get(args.cluster)


def _forwarded(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.remote import client

    raw = getattr(args, "raw_argv", None)
    if raw is None:
        raise UserError("--cluster: this command line cannot be sent (no argv)", code=1)
    return client.forward(_cluster(args), without_option(list(raw), CLUSTER_OPTION))


def _run(args: argparse.Namespace) -> int:
    """``mxc run --cluster``: the bundle resolved and checked here, asked about here, copied if the
    cluster lacks it, then ``mxc run HASH -y`` there (sbatch, record, alerts: that mxc's)."""
    from mxc import refs
    from mxc.cli.common import store
    from mxc.errors import UserError
    from mxc.remote import client

    if args.overrides:
        raise UserError("a bundle is immutable: `mxc run` cannot --set fields",
                        "build a new bundle with `mxc build SPEC --set KEY=VALUE`, then `mxc run --cluster` it")
    if args.local:
        raise UserError("--local and --cluster contradict each other", "--cluster NAME runs on that cluster")
    for name in args.labels:
        refs.check_label(name)
    cluster = _cluster(args)
    st = store()
    bundle = st.get(args.bundle) if args.bundle else st.current()
    st.require_intact(bundle)
    from mxc.runtime.contract import load as load_contract

    contract = load_contract(bundle)
    if contract.backend == "local":
        raise UserError(f"bundle {bundle.hash[:12]} ({contract.name}) runs on the machine that starts it "
                        "(runtime.backend: local): --cluster submits cluster bundles",
                        "build one for the cluster: mxc build SPEC --set runtime.backend=slurm")
    if not args.dry_run:
        from mxc.cli.confirm import confirm_submission

        where = f"{contract.backend} on cluster {cluster.name} ({cluster.login})"
        if not confirm_submission(bundle, contract, where, "(its id is chosen there)", named=bool(args.bundle),
                                  yes=args.yes):
            print("mxc: not submitted", file=sys.stderr)
            return 1
    if args.wait:
        from mxc.cli.wait import check_interval

        check_interval(args.interval)
    argv = ["run", bundle.hash, "-y"]
    for label in dict.fromkeys(args.labels):
        argv += ["--label", label]
    flags = {"--dry-run": args.dry_run, "--quiet": args.quiet, "--json": args.json, "--detach": args.detach}
    argv += [flag for flag, given in flags.items() if given]
    if args.wait:
        argv += ["--wait", "--interval", repr(args.interval)]
    if args.resume_from:
        argv += ["--resume-from", args.resume_from]

    def told(transfer: Any) -> None:
        if not args.quiet:
            print(transfer.line(), file=sys.stderr)

    return client.submit(cluster, bundle, argv, told)


def _report(args: argparse.Namespace) -> int:
    """``mxc report --cluster``: made on the login node, where the runs' TSDB and logs are (they can
    be large; the report is one file), and written here."""
    from mxc.errors import UserError
    from mxc.fsutil import write_atomic
    from mxc.remote import client
    from mxc.runtime.rundir import is_run_id

    output: Path | None = args.output
    suffix = output.suffix.lower() if output is not None else ".html"
    if suffix not in (".html", ".htm", ".png"):
        raise UserError(f"{output}: the report is .html or .png")
    cluster = _cluster(args)
    content, summary = client.report(cluster, list(args.refs), ".png" if suffix == ".png" else ".html", args.no_tsdb)
    if output is None:
        first = str((summary.get("runs") or [{}])[0].get("run", ""))
        output = Path(f"report-{first}.html" if is_run_id(first) else "report.html")
    try:
        write_atomic(output, content)
    except OSError as exc:
        from mxc.errors import cannot_write

        raise cannot_write(str(output), exc) from None
    summary["output"] = str(output)
    if args.json:
        print_json(summary)
    else:
        print(shown(f"mxc: report written: {output} (made on cluster {cluster.name})"))
    return 0
