"""Reaching a login node: the user's own ssh, one shared connection, every value quoted.

mxc stores no credential and speaks no SSH itself: it runs ``ssh`` (``$MXC_SSH_COMMAND``, like
git's ``GIT_SSH_COMMAND``, default ``ssh``), so the user's ``~/.ssh/config`` (Host aliases, ports,
ProxyJump, keys), agent and known hosts decide how it logs in. What mxc adds:

* one connection per cluster, shared by every call (``ControlMaster=auto``, a socket in this user's
  private ``/tmp/mxc-<uid>/ssh``, ``ControlPersist`` 10 minutes): a second command opens no new
  login, so a no-op re-submit costs the remote mxc's start, not an SSH handshake;
* no prompt where nobody can answer (``BatchMode=yes`` unless stdin is a terminal: then the first
  connection may ask for a passphrase or a one-time code, and later ones reuse it);
* limits: a connection that cannot be made in ``CONNECT_TIMEOUT`` seconds, or stops answering for
  a minute (keep-alives), ends with one line naming the cause, never a hang;
* ssh sends the remote side one command *string* that the login shell parses, so every word of it
  is ``shlex.quote``d (the login shell must be POSIX: sh, bash, zsh, ksh, dash); the destination
  never starts with ``-`` (profiles.LOGIN), and ``--`` ends ssh's options before it.

ssh's own failures (exit 255) become ``UserError``: host key, authentication and an unknown host
name are the user's set-up (exit 2), an unreachable host is the machine's state (exit 1). A remote
shell's 127 is a missing mxc there (exit 2).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from mxc.errors import UserError
from mxc.remote.profiles import Cluster

SSH_VARIABLE = "MXC_SSH_COMMAND"
CONNECT_TIMEOUT = 20  # seconds for the TCP connection and the SSH handshake
KEEPALIVE_S = 15  # a silent connection is probed every 15 s ...
KEEPALIVE_MISSES = 4  # ... and given up after 4 unanswered probes
PERSIST = "10m"  # the shared connection outlives the last command this long
SSH_FAILED = 255  # ssh's own exit status for its errors
NOT_FOUND = 127  # a POSIX shell's for a command it cannot find

# ssh's messages -> (what happened, what to do, exit status)
_CAUSES = (
    ("Permission denied", "the login was refused", "mxc logs in with your ssh set-up: make `ssh {login} true` work "
     "without a prompt (a key in ssh-agent, IdentityFile in ~/.ssh/config)", 2),
    ("Host key verification failed", "its host key is unknown or changed", "check and accept it once with: ssh {login}", 2),
    ("Could not resolve hostname", "the host name is unknown", "fix the profile (mxc cluster add NAME ... --replace) "
     "or add a Host entry to ~/.ssh/config", 2),
    ("Connection refused", "the host refused the connection (no sshd on that port)", "", 1),
    ("timed out", "the host did not answer", "", 1),
    ("No route to host", "the host cannot be reached (no route)", "", 1),
    ("Network is unreachable", "the network is unreachable", "", 1),
    ("Connection closed", "the host closed the connection", "", 1),
    ("Connection reset", "the host reset the connection", "", 1),
)


def ssh_words() -> list[str]:
    configured = os.environ.get(SSH_VARIABLE)
    if not configured:
        return ["ssh"]
    try:
        words = shlex.split(configured)
    except ValueError as exc:
        raise UserError(f"${SSH_VARIABLE}: {exc}", "the ssh command as words, e.g. 'ssh -F ~/.ssh/cluster_config'") from None
    if not words:
        raise UserError(f"${SSH_VARIABLE} is empty", f"unset it, or name the ssh command: {SSH_VARIABLE}=ssh")
    return words


def control_dir() -> Path | None:
    """This user's private directory for the shared connections' sockets (None: no sharing)."""
    from mxc.runtime.processes import scratch

    try:
        path = scratch.root() / "ssh"
        path.mkdir(mode=0o700, exist_ok=True)
    except (OSError, RuntimeError):
        return None
    return path


def options(batch: bool = True) -> list[str]:
    opts = ["-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", f"ServerAliveInterval={KEEPALIVE_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_MISSES}"]
    if batch:
        opts += ["-o", "BatchMode=yes"]
    shared = control_dir()
    if shared is not None:  # %C: a hash of the local host, remote host, port and user (short, fixed length)
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={shared}/%C", "-o", f"ControlPersist={PERSIST}"]
    return opts


def argv(cluster: Cluster, command: str | None, batch: bool = True, control: str | None = None) -> list[str]:
    words = [*ssh_words(), *options(batch)]
    if control is not None:
        words += ["-O", control]
    return [*words, "--", cluster.login, *([command] if command is not None else [])]


def failure(cluster: Cluster, stderr: str, code: int) -> UserError:
    """ssh's exit 255 (or a remote shell's 127) as one line naming the cause."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if code == NOT_FOUND:
        shown = " ".join(cluster.mxc)
        return UserError(f"cluster {cluster.name}: mxc was not found on {cluster.login} (`{shown}`: "
                         f"{lines[-1] if lines else 'command not found'})",
                         f"install mxc there, or name it: mxc cluster add {cluster.name} {cluster.login} "
                         "--mxc /path/to/mxc --replace")
    for needle, what, hint, exit_code in _CAUSES:
        if any(needle in line for line in lines):
            return UserError(f"cluster {cluster.name}: cannot reach {cluster.login}: {what}",
                             hint.format(login=cluster.login), code=exit_code)
    last = lines[-1] if lines else f"ssh exited {code}"
    return UserError(f"cluster {cluster.name}: ssh to {cluster.login} failed: {last[:300]}", code=1)


_connected: set[str] = set()  # logins this process has reached (one check per command, not per call)


def connect(cluster: Cluster) -> None:
    """Make sure a shared connection to the login node is up (cheap when it is: a local socket
    check); otherwise log in once, which leaves the shared connection behind for later calls.
    UserError, one line, when the login node cannot be reached or refuses the login."""
    if cluster.login in _connected:
        return
    _connected.add(cluster.login)
    if control_dir() is not None:
        check = subprocess.run(argv(cluster, None, control="check"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if check.returncode == 0:
            return
    # stderr to a file, not a pipe: the shared connection this login leaves behind keeps ssh's
    # descriptors, and a pipe would then never reach its end.
    interactive = sys.stdin.isatty()
    with tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(argv(cluster, "true", batch=not interactive),
                                  stdin=None if interactive else subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=CONNECT_TIMEOUT * 3 if not interactive else None, check=False)
        except FileNotFoundError:
            raise UserError(f"cluster {cluster.name}: no ssh command ({ssh_words()[0]})",
                            "install OpenSSH's client, or set MXC_SSH_COMMAND") from None
        except subprocess.TimeoutExpired:
            raise UserError(f"cluster {cluster.name}: cannot reach {cluster.login}: no answer in "
                            f"{CONNECT_TIMEOUT * 3} s", code=1) from None
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    if done.returncode != 0:
        _connected.discard(cluster.login)
        raise failure(cluster, text, done.returncode)


def run(cluster: Cluster, command: str, input: bytes | None = None, timeout: float | None = None,
        limit: int = 1 << 30) -> tuple[int, bytes]:
    """Run ``command`` (already quoted) there: (exit status, stdout). Its stderr is passed on, so
    the remote mxc's own one-line errors reach the user. ssh's failures raise (see ``failure``)."""
    connect(cluster)
    with tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(argv(cluster, command), input=input, stdin=None if input is not None else
                                  subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise UserError(f"cluster {cluster.name}: no answer from {cluster.login} in {timeout:.0f} s", code=1) from None
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    if done.returncode in (SSH_FAILED, NOT_FOUND):
        raise failure(cluster, text, done.returncode)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    if len(done.stdout) > limit:
        raise UserError(f"cluster {cluster.name}: the answer from {cluster.login} is larger than {limit} bytes", code=1)
    return done.returncode, done.stdout


def stream(cluster: Cluster, command: str, stdout: IO[bytes] | None = None) -> int:
    """Run ``command`` there with its output streaming to ours as it comes (``logs -f``); its exit
    status. A connection lost on the way is one line and exit 1."""
    with opened(cluster, command, stdout=stdout) as done:
        done.wait()
    return exit_status(cluster, done.returncode)


def opened(cluster: Cluster, command: str, stdout: IO[bytes] | int | None = None) -> subprocess.Popen[bytes]:
    """``command`` started there, its stdin a pipe held open until the caller is done with it: when this
    process goes (Ctrl-C), the remote side reads end of file and stops (``agent._end_with_the_laptop``).
    Its stderr is ours: the remote mxc's one-line errors reach the user as they are."""
    connect(cluster)
    return subprocess.Popen(argv(cluster, command), stdin=subprocess.PIPE, stdout=stdout)


def exit_status(cluster: Cluster, code: int) -> int:
    """The remote command's exit status, or UserError for what ssh or the login shell said instead."""
    if code == NOT_FOUND:
        raise failure(cluster, "", NOT_FOUND)
    if code == SSH_FAILED:
        raise UserError(f"cluster {cluster.name}: the connection to {cluster.login} ended (ssh exit 255)",
                        "try again; mxc cluster check " + cluster.name + " says what is wrong", code=1)
    return code


def disconnect(cluster: Cluster) -> bool:
    """End the shared connection to the login node, if one is up (``mxc cluster rm``, tests)."""
    if control_dir() is None:
        return False
    done = subprocess.run(argv(cluster, None, control="exit"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False)
    return done.returncode == 0
