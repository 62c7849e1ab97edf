"""The remote tests' machines (mxc/remote/): a throw-away OpenSSH server on 127.0.0.1, the "login node"
behind it and the "laptop" in front of it.

Debian's openssh-server (scripts/setup.sh installs it; no system sshd is started or touched):
``sshd -D -e -f <own config>`` as a child of the test, on a port picked free, with a host key and a
user key made for the session in a private temporary directory. The tests run as root here, so the
server lets root in, by that key only, from 127.0.0.1 only (``AllowUsers root@127.0.0.1``; password,
keyboard-interactive, forwarding and agent forwarding off). ``StrictModes no``: the keys live under
/tmp, which is world-writable, and sshd's ownership walk up to / would refuse them (the directory
itself is 0700).

The client side is the laptop's: an ssh config file of its own (``ssh -F``, given to mxc through
``MXC_SSH_COMMAND``) with Host aliases for the server (``mxc-test-login``), for the same server with
a key it does not accept (``mxc-test-badkey``), with a host key it does not know (``mxc-test-unknown``)
and for a port nobody listens on (``mxc-test-closed``). Host keys are checked (``StrictHostKeyChecking
yes``, the server's key in the config's own known_hosts).

Stopping closes the shared connections mxc left (``ssh -O exit``), then ends the server by its pid.

The laptop (``Laptop``) is mxc with a home and a config directory of its own, ssh through that config;
the login node's mxc (``login_node``) is this repository's in an environment of its own, with a home
elsewhere: as if on another machine.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO, SPECS
from tests.slurm_cluster import free_ports

SSHD = "/usr/sbin/sshd"
LOGIN = "mxc-test-login"
BADKEY = "mxc-test-badkey"
UNKNOWN = "mxc-test-unknown"
CLOSED = "mxc-test-closed"
ALIASES = (LOGIN, BADKEY, UNKNOWN, CLOSED)


@dataclass(frozen=True)
class Sshd:
    root: Path
    port: int
    config: Path  # the client's ssh config (ssh -F)
    log: Path  # the server's log (-e: everything it says)
    pid: int

    @property
    def ssh_command(self) -> str:
        """``MXC_SSH_COMMAND`` for the laptop side."""
        return f"ssh -F {self.config}"


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text().strip()


def _server_config(root: Path, port: int) -> str:
    return "\n".join([
        "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {root / 'host_key'}", "PidFile none",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "AuthenticationMethods publickey",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "AllowUsers root@127.0.0.1", "StrictModes no", "UsePAM no",
        "X11Forwarding no", "AllowTcpForwarding no", "AllowAgentForwarding no", "PermitTunnel no",
        "PermitUserEnvironment no", "PrintMotd no", "LogLevel VERBOSE", "MaxSessions 50", "MaxStartups 50:30:100",
        "",
    ])


def _client_config(root: Path, port: int, closed_port: int) -> str:
    def host(alias: str, port: int, key: str, known: str, name: str = "127.0.0.1") -> str:
        return "\n".join([
            f"Host {alias}", f"  HostName {name}", f"  Port {port}", "  User root", f"  IdentityFile {root / key}",
            "  IdentitiesOnly yes", f"  UserKnownHostsFile {root / known}", "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes", "  PasswordAuthentication no", "  KbdInteractiveAuthentication no", "",
        ])

    # The failing aliases name the server "localhost": a shared connection is keyed by user, host name and
    # port (ssh's %C), so under the login alias's name they would reuse its connection and never log in.
    return (host(LOGIN, port, "user_key", "known_hosts") + host(BADKEY, port, "other_key", "known_hosts", "localhost")
            + host(UNKNOWN, port, "user_key", "empty_known_hosts", "localhost")
            + host(CLOSED, closed_port, "user_key", "known_hosts"))


def _wait_listening(process: subprocess.Popen[bytes], log: Path, port: int) -> bool:
    """True once sshd says it listens; False when it exited first (the port was taken meanwhile).
    Waits on the log's lines (an inotify-free poll of the file's growth), never on a fixed time."""
    import time

    want = f"Server listening on 127.0.0.1 port {port}."
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if want in text:
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)


@contextlib.contextmanager
def running_sshd() -> Iterator[Sshd]:
    root = Path(tempfile.mkdtemp(prefix="mxc-sshd-"))
    os.chmod(root, 0o700)
    host_public = _keygen(root / "host_key", "mxc-test-host")
    (root / "authorized_keys").write_text(_keygen(root / "user_key", "mxc-test-user") + "\n")
    (root / "authorized_keys").chmod(0o600)
    _keygen(root / "other_key", "mxc-test-not-authorized")
    (root / "empty_known_hosts").write_text("")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory (Debian's)
    log = root / "sshd.log"
    process: subprocess.Popen[bytes] | None = None
    for _ in range(5):  # another test may take the free port between the pick and sshd's bind
        port, closed = free_ports(2)
        (root / "sshd_config").write_text(_server_config(root, port))
        subprocess.run([SSHD, "-t", "-f", str(root / "sshd_config")], check=True)
        with open(log, "wb") as out:
            process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=out)
        if _wait_listening(process, log, port):
            break
        process.wait()
        process = None
    if process is None:
        raise RuntimeError(f"sshd did not start: {log.read_text(errors='replace')[-2000:]}")
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public}\n[localhost]:{port} {host_public}\n")
    (root / "ssh_config").write_text(_client_config(root, port, closed))
    server = Sshd(root, port, root / "ssh_config", log, process.pid)
    try:
        yield server
    finally:
        close_shared_connections(server)
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def close_shared_connections(server: Sshd) -> None:
    """End the ControlMaster connections mxc opened to the test server (``ssh -O exit``), so that no
    ssh process of the tests outlives them."""
    from mxc.remote import ssh

    shared = ssh.control_dir()
    if shared is None:
        return
    for alias in ALIASES:
        subprocess.run(["ssh", "-F", str(server.config), "-o", f"ControlPath={shared}/%C", "-O", "exit", alias],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def login_node(root: Path, env: dict[str, str]) -> Path:
    """The login node's ``mxc``: this repository's, started the way a site's module or wrapper starts it,
    in the environment ``env`` (what ``module load`` would set: Slurm's config, PATH); returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(env.items()))
    script = root / "mxc"
    script.write_text(f"#!/bin/sh\n# the login node's mxc (tests/remote_support.py)\n{exports}"
                      f"exec {shlex.quote(sys.executable)} -m mxc \"$@\"\n")
    script.chmod(0o755)
    return script


class Laptop:
    """The laptop's mxc: its own MXC_HOME and config directory, ssh through the test server's config."""

    def __init__(self, root: Path, sshd: Sshd, **env: str) -> None:
        self.root = root
        self.home = root / "laptop-home"
        self.config = root / "laptop-config"
        self.env = {**os.environ, "MXC_HOME": str(self.home), "MXC_CONFIG": str(self.config),
                    "MXC_SSH_COMMAND": sshd.ssh_command, **env}

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "mxc", *args], cwd=REPO, env=self.env, capture_output=True,
                             stdin=subprocess.DEVNULL, text=True, timeout=timeout)
        assert "Traceback" not in out.stderr, out.stderr
        return out

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "mxc", *args], cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def build(self, *sets: str) -> str:
        out = self("build", "-q", str(SPECS / "tiny.yaml"), *sets)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()
