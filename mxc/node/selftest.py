"""Self-test of the node program's leaf modules on the machine it runs on: ``python3 -m <package>.selftest``.

It exercises each module against this machine's real /proc and /sys and a scratch directory, with
only the interpreter it is started by, so a node whose ``python3`` is too old or too bare for the
node program says so in a second. Prints one line per module and ``selftest: ok``; exit 1 and
the first failure otherwise.
"""

from __future__ import annotations

import json
import os
import platform
import struct
import sys
import tempfile
from pathlib import Path

from . import checkpoints, envboundary, eventscrub, netif, postmortem, preflight, stacks


class SelfTestFailure(Exception):
    pass


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise SelfTestFailure(what)


def check_netif() -> str:
    expect(netif.nccl_match("ib0", "ib") and not netif.nccl_match("eth0", "ib"), "nccl_match: prefixes")
    expect(not netif.nccl_match("docker0", "^docker,lo") and netif.nccl_match("eth0", "^docker,lo"), "nccl_match: ^")
    expect(netif.nccl_match("eth0", "=eth0") and not netif.nccl_match("eth01", "=eth0"), "nccl_match: =")
    choice = netif.choose_interface(Path("/sys/class/net"), configured=None, nccl_spec=None,
                                    coordinator="127.0.0.1:1234", route_to=netif.route_via_ip)
    expect(bool(choice.name) and choice.nccl_socket_ifname == netif.exact(choice.name), f"choose_interface: {choice}")
    ports = netif.rdma_devices(Path("/sys/class/infiniband"))
    return f"interface {choice.name} ({choice.reason}); {len(ports)} RDMA port(s)"


def check_checkpoints(scratch: Path) -> str:
    root = checkpoints.checkpoints_dir(scratch / "output", "run")
    for step, marker in ((5, checkpoints.COMMIT_MARKER), (10, None)):
        (root / str(step)).mkdir(parents=True)
        if marker:
            (root / str(step) / marker).write_text("done")
    (root / "15.orbax-checkpoint-tmp").mkdir()
    expect(checkpoints.latest_checkpoint(root) == 5, "latest_checkpoint: only step 5 is finished")
    expect(checkpoints.latest_checkpoint(scratch / "missing") is None, "latest_checkpoint: no directory")
    return "latest finished step found, unfinished saves ignored"


def check_preflight(scratch: Path) -> str:
    config = preflight.PreflightConfig(run_dir=str(scratch / "run"), disk_path=scratch / "output", min_free_gb=0.0,
                                       gpus=None, stale_processes=True, network=True)
    result = preflight.run_checks(config, node=platform.node(), rank=0, attempt=0, env=dict(os.environ),
                                  interface="lo")
    path = scratch / "run" / "ranks" / "0" / "preflight.json"
    result.write(path)
    data = json.loads(path.read_text())
    expect(list(data) == ["node", "rank", "attempt", "checks", "passed"], f"preflight.json keys: {list(data)}")
    expect([c["check"] for c in data["checks"]] == ["stale_processes", "disk", "network"], f"checks: {data['checks']}")
    disk = next(c for c in result.checks if c.check == "disk")
    expect(disk.passed, f"disk: {disk.detail}")
    return "; ".join(f"{c.check} {c.status}" for c in result.checks)


def check_postmortem(scratch: Path) -> str:
    postmortem.limit_core_size(1)
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_CORE)
    expect(soft <= 1 << 20, f"limit_core_size: soft limit {soft}")
    pm = postmortem.Postmortem(run_dir=scratch / "run", rank_dir=scratch / "run" / "ranks" / "0", rank=0, attempt=0,
                               node=platform.node(), max_mb=1, keep=1, backtrace=False, cwd=scratch)
    pm.begin()
    marker = pm.marker
    expect(marker is not None and marker.exists(), "begin: marker")
    expect(pm.collect(0, None) == [] and not (marker and marker.exists()), "collect(0): nothing kept, marker removed")
    oom = postmortem.cgroup_oom_kills(Path("/proc"), Path("/sys/fs/cgroup"))
    return f"core limit set; cgroup oom_kill count {oom if oom is not None else 'not readable'}"


def check_stacks() -> str:
    mine = stacks.python_pids(os.getpgid(0))
    expect(os.getpid() in mine, f"python_pids: {os.getpid()} not in {mine}")
    return f"py-spy: {stacks.find_py_spy() or 'not installed (faulthandler)'}"


def check_eventscrub(scratch: Path) -> str:
    expect(eventscrub.crc32c(b"123456789") == 0xE3069283, "crc32c: the CRC-32C check value")
    secret = "hf_" + "Sx" * 16
    body = b"hf_access_token " + secret.encode()
    events = scratch / "tb" / "events.out.tfevents.1"
    events.parent.mkdir(parents=True)
    length = struct.pack("<Q", len(body))
    events.write_bytes(length + struct.pack("<I", eventscrub.masked_crc(length)) + body
                       + struct.pack("<I", eventscrub.masked_crc(body)))
    expect(eventscrub.EventScrubber(scratch / "tb", [secret]).scan() == 1, "EventScrubber: one record masked")
    data = events.read_bytes()
    expect(secret.encode() not in data and len(data) == 12 + len(body) + 4, "EventScrubber: masked in place")
    expect(struct.unpack("<I", data[-4:])[0] == eventscrub.masked_crc(data[12:-4]), "EventScrubber: CRC rewritten")
    base = envboundary.training_base({"PATH": "/bin", "XLA_FLAGS": "-", "MXC_RUN_DIR": "/r", "SLURM_PROCID": "0"})
    expect(sorted(base) == ["PATH", "SLURM_PROCID"], f"training_base: {sorted(base)}")
    return "a secret masked in an event file, its CRC rewritten; the environment boundary holds"


def main() -> int:
    print(f"selftest: Python {platform.python_version()} at {sys.executable} (prefix {sys.prefix})")
    try:
        with tempfile.TemporaryDirectory(prefix="mxc-node-selftest-") as tmp:
            scratch = Path(tmp)
            for name, run in (("netif", check_netif), ("checkpoints", lambda: check_checkpoints(scratch / "c")),
                              ("preflight", lambda: check_preflight(scratch / "p")),
                              ("postmortem", lambda: check_postmortem(scratch / "m")), ("stacks", check_stacks),
                              ("eventscrub", lambda: check_eventscrub(scratch / "e"))):
                print(f"selftest: {name}: {run()}")
    except SelfTestFailure as exc:
        print(f"selftest: FAILED: {exc}", file=sys.stderr)
        return 1
    print("selftest: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
