"""The node detectors (mxc/node/detect.py) over recorded /sys trees and command outputs, the
precedence of what reaches training, the report a rank writes, and its drift between two records
(mxc/runtime/detections.py). Sources of every fixture: tests/fixtures/sys/README.md,
tests/fixtures/commands/README.md."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from mxc.node import detect, envmerge, layout
from mxc.runtime import detections
from tests.conftest import REPO, Mxc

FIXTURES = REPO / "tests" / "fixtures"
SYS = FIXTURES / "sys"
COMMANDS = FIXTURES / "commands"
KERNEL = FIXTURES / "kernel"


def make_root(tmp: Path, *, ib: str | None = None, net: str | None = None) -> Path:
    """A filesystem root with recorded /sys/class trees where the node has them."""
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    if ib:
        shutil.copytree(SYS / ib, root / "sys/class/infiniband")
    if net:
        shutil.copytree(SYS / net, root / "sys/class/net", symlinks=True)
    return root


def runner(outputs: dict[str, tuple[int, str]]) -> detect.Runner:
    """Commands answered from recordings, by their first word; any other is not installed."""
    def run(argv: Sequence[str]) -> detect.Output | None:
        found = outputs.get(argv[0])
        return detect.Output(*found) if found else None
    return run


def recorded(name: str) -> str:
    return (COMMANDS / name).read_text()


def set_kernel(root: Path, release: str, config: Path | None, where: str = "boot") -> None:
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")
    if config is None:
        return
    target = root / "boot" / f"config-{release}" if where == "boot" else root / "proc/config.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, target)


# ---- ib_hca


def test_ib_hca_lists_every_active_port_exactly(tmp_path: Path) -> None:
    found = detect.detect_ib_hca(detect.Node(make_root(tmp_path, ib="infiniband-procfs")))
    assert found.values == {"NCCL_IB_HCA": "=hfi1_0:1,mlx4_0:1,mlx4_0:2,mlx5_0:1"}
    assert found.inputs["ports"]["mlx4_0:2"] == {"state": "ACTIVE", "link_layer": "InfiniBand"}


def test_ib_hca_leaves_out_a_port_that_is_down_and_says_why_when_none_is_up(tmp_path: Path) -> None:
    root = make_root(tmp_path, ib="infiniband-roce-nccl1131")
    (root / "sys/class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
    assert detect.detect_ib_hca(detect.Node(root)).values == {"NCCL_IB_HCA": "=mlx5_0:1"}
    (root / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    none = detect.detect_ib_hca(detect.Node(root))
    assert none.values == {} and none.reason == "none of 2 RDMA port(s) is ACTIVE"


def test_ib_hca_without_rdma_sets_nothing(tmp_path: Path) -> None:
    found = detect.detect_ib_hca(detect.Node(make_root(tmp_path)))
    assert found.values == {} and found.reason.startswith("no RDMA device under ")


# ---- gid_index


@pytest.mark.parametrize(("tree", "index", "table"), [("infiniband-roce-nccl1131", "3", [0, 1, 2, 3]),
                                                      ("infiniband-roce-k8s-nccl1573", "7", [4, 5, 6, 7])])
def test_gid_index_is_the_routable_roce_v2_entry(tmp_path: Path, tree: str, index: str, table: list[int]) -> None:
    """1131: link-local v1/v2 at 0-1, IPv4-mapped v1/v2 at 2-3; the k8s pod's table starts at 4."""
    found = detect.detect_gid_index(detect.Node(make_root(tmp_path, ib=tree)))
    assert found.values == {"NCCL_IB_GID_INDEX": index}
    assert found.reason == f"routable RoCE v2 GID at index {index} on 2 ACTIVE RoCE port(s)"
    assert [g["index"] for g in found.inputs["ports"]["mlx5_0:1"]] == table  # the populated entries, as read


def test_gid_index_falls_back_to_an_untyped_entry_on_old_drivers(tmp_path: Path) -> None:
    root = make_root(tmp_path, ib="infiniband-roce-nccl1131")
    for dev in ("mlx5_0", "mlx5_1"):
        shutil.rmtree(root / f"sys/class/infiniband/{dev}/ports/1/gid_attrs/types")
    found = detect.detect_gid_index(detect.Node(root))
    assert found.values == {"NCCL_IB_GID_INDEX": "2"}  # the first routable one: no type says v2
    assert "type unknown" in found.reason


def test_gid_index_stays_unset_when_ports_disagree_or_none_is_roce(tmp_path: Path) -> None:
    root = make_root(tmp_path, ib="infiniband-roce-nccl1131")
    port = root / "sys/class/infiniband/mlx5_1/ports/1"
    (port / "gids/3").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")  # the v2 GID moved to 5
    (port / "gids/5").write_text("0000:0000:0000:0000:0000:ffff:0b00:0049\n")
    (port / "gid_attrs/types/5").write_text("RoCE v2\n")
    found = detect.detect_gid_index(detect.Node(root))
    assert found.values == {}
    assert found.reason.startswith("ACTIVE RoCE ports disagree (mlx5_0:1 3, mlx5_1:1 5)")
    ib = detect.detect_gid_index(detect.Node(make_root(tmp_path / "ib", ib="infiniband-procfs")))
    assert ib.values == {} and ib.reason == "no ACTIVE RoCE (Ethernet link layer) port"


# ---- ainic_tc


def test_ainic_tc_from_the_no_drop_and_strict_priorities() -> None:
    node = detect.Node(Path("/nonexistent"), runner({"nicctl": (0, recorded("nicctl-show-qos-pfc3-strict6.txt"))}))
    found = detect.detect_ainic_tc(node)
    assert found.values == {"NCCL_IB_TC": "104", "NCCL_IB_FIFO_TC": "192"}
    assert found.reason == "no-drop priority 3 <- DSCP 26; strict priority 6 <- DSCP 48 (same on 2 NICs)"
    assert found.inputs["command"] == "nicctl show qos" and "PFC no-drop priorities    : 3" in found.inputs["output"]


def test_ainic_tc_without_pfc_without_nicctl_or_when_it_fails_sets_nothing() -> None:
    no_pfc = detect.detect_ainic_tc(detect.Node(run=runner({"nicctl": (0, recorded("nicctl-show-qos-node-scraper.txt"))})))
    assert no_pfc.values == {} and no_pfc.reason == "no PFC no-drop priority configured"
    missing = detect.detect_ainic_tc(detect.Node(run=runner({})))
    assert missing.values == {} and missing.reason.startswith("nicctl is not installed here")
    failed = detect.detect_ainic_tc(detect.Node(run=runner({"nicctl": (1, "permission denied\n")})))
    assert failed.values == {} and failed.reason == "`nicctl show qos` failed (exit 1)"


def test_ainic_tc_stays_unset_when_nics_differ() -> None:
    text = recorded("nicctl-show-qos-pfc3-strict6.txt")
    second = text.index("NIC  : 2222222")
    text = text[:second] + text[second:].replace("PFC no-drop priorities    : 3", "PFC no-drop priorities    : 6")
    found = detect.detect_ainic_tc(detect.Node(run=runner({"nicctl": (0, text)})))
    assert found.values == {} and found.reason == "the 2 NICs' QoS maps give different traffic classes"


# ---- socket_ifname


def test_socket_ifname_prefers_a_private_range_and_skips_bridges(tmp_path: Path) -> None:
    """Recorded here: the 10.x address is a podman bridge's, so eth0 (192.0.2.2, no private range) wins."""
    node = detect.Node(make_root(tmp_path, net="net-vm"), runner({"ip": (0, recorded("ip-addr-vm.txt"))}))
    found = detect.detect_socket_ifname(node)
    assert found.values == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert found.reason == "eth0 has 192.0.2.2 (no private range)"
    assert found.inputs["operstate"] == {"eth0": "up", "cni-podman0": "down"}


def test_socket_ifname_takes_10_over_192_168() -> None:
    found = detect.detect_socket_ifname(detect.Node(run=runner({"ip": (0, recorded("ip-addr-nccl177.txt"))})))
    assert found.values == {"NCCL_SOCKET_IFNAME": "=bond0.2973"}
    assert found.reason == "bond0.2973 has 10.0.106.189 (10.0.0.0/8)"


def test_socket_ifname_skips_a_down_interface_and_says_when_nothing_is_left(tmp_path: Path) -> None:
    root = make_root(tmp_path, net="net-vm")
    (root / "sys/class/net/eth0/operstate").write_text("down\n")
    found = detect.detect_socket_ifname(detect.Node(root, runner({"ip": (0, recorded("ip-addr-vm.txt"))})))
    assert found.values == {}
    assert found.reason == "no interface that is up has a global IPv4 address (skipped: cni-podman0, eth0)"


# ---- dmabuf


def test_dmabuf_on_a_kernel_built_for_it(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    set_kernel(root, "6.8.0-107-generic", KERNEL / "config-6.8.0-107-generic")
    found = detect.detect_dmabuf(detect.Node(root))
    assert found.values == {"NCCL_DMABUF_ENABLE": "1"}
    assert found.inputs["config"] == str(root / "boot/config-6.8.0-107-generic")


def test_dmabuf_is_0_on_the_recorded_vm_kernel_without_its_options(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    set_kernel(root, (KERNEL / "osrelease-vm").read_text().strip(), KERNEL / "config-6.18.44-fc-v657.gz", "proc")
    found = detect.detect_dmabuf(detect.Node(root))
    assert found.values == {"NCCL_DMABUF_ENABLE": "0"}
    assert found.reason == "kernel 6.18.44-fc-v657 built without CONFIG_DMABUF_MOVE_NOTIFY, CONFIG_PCI_P2PDMA"
    assert found.inputs["options"] == {"CONFIG_DMABUF_MOVE_NOTIFY": "not set", "CONFIG_PCI_P2PDMA": "not set"}


def test_dmabuf_is_0_without_a_kernel_config_or_on_an_old_kernel(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    set_kernel(root, "6.8.0-107-generic", None)
    found = detect.detect_dmabuf(detect.Node(root))
    assert found.values == {"NCCL_DMABUF_ENABLE": "0"} and found.reason.startswith("kernel config unreadable")
    set_kernel(root, "5.4.0-42-generic", None)
    old = detect.detect_dmabuf(detect.Node(root))
    assert old.values == {"NCCL_DMABUF_ENABLE": "0"} and old.reason == "kernel 5.4.0-42-generic is older than 5.12"
    assert detect.detect_dmabuf(detect.Node(tmp_path / "empty")).values == {}  # no release: nothing to say


# ---- what reaches training


def test_a_value_already_set_wins_and_only_the_guard_lowers_one(tmp_path: Path) -> None:
    root = make_root(tmp_path, ib="infiniband-roce-nccl1131")
    set_kernel(root, "6.8.0-107-generic", None)  # no config: the guard says 0
    updates, report = detect.run_detectors(["gid_index", "ib_hca", "dmabuf"],
                                           {"NCCL_IB_GID_INDEX": "1", "NCCL_DMABUF_ENABLE": "1"}, detect.Node(root))
    assert updates == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_DMABUF_ENABLE": "0"}
    by_name = {entry["detector"]: entry for entry in report}
    assert by_name["gid_index"]["found"] == {"NCCL_IB_GID_INDEX": "3"}
    assert by_name["gid_index"]["variables"] == {"NCCL_IB_GID_INDEX": {"value": None, "how": "kept", "was": "1"}}
    assert by_name["dmabuf"]["variables"]["NCCL_DMABUF_ENABLE"] == {"value": "0", "how": "guard", "was": "1"}
    assert detect.summary(by_name["gid_index"]).startswith("detect gid_index: NCCL_IB_GID_INDEX kept as set (1)")
    _, zero = detect.run_detectors(["dmabuf"], {"NCCL_DMABUF_ENABLE": "0"}, detect.Node(root))
    assert zero[0]["variables"]["NCCL_DMABUF_ENABLE"]["how"] == "kept"  # never raised, never touched


def test_a_detector_that_fails_or_is_unknown_sets_nothing_and_says_so() -> None:
    def broken(argv: Sequence[str]) -> detect.Output | None:
        raise RuntimeError("boom")

    updates, report = detect.run_detectors(["ainic_tc", "quantum_hca"], {}, detect.Node(run=broken))
    assert updates == {}
    assert report[0]["reason"] == "detector failed: RuntimeError: boom"
    assert report[0]["variables"]["NCCL_IB_TC"] == {"value": None, "how": "unset", "was": None}
    assert report[1] == {"detector": "quantum_hca", "found": {}, "reason": "no such detector in this node program",
                         "inputs": {}, "variables": {}}
    assert detect.summary(report[1]) == "detect quantum_hca: (no such detector in this node program)"


def test_the_report_reaches_the_record_and_a_different_detection_is_drift(tmp_path: Path) -> None:
    runs = []
    for tree in ("infiniband-roce-nccl1131", "infiniband-roce-k8s-nccl1573"):
        run = tmp_path / tree
        _, report = detect.run_detectors(["gid_index", "ainic_tc"], {}, detect.Node(make_root(run, ib=tree), runner({})))
        detect.write_report(layout.detected(run, 0), rank=0, node="node1", attempt=0, entries=report)
        runs.append(detections.collect(run))
    a, b = runs
    assert a is not None and b is not None
    assert a["0"]["node"] == "node1"
    assert a["0"]["detectors"]["gid_index"]["variables"]["NCCL_IB_GID_INDEX"]["value"] == "3"
    assert json.loads(layout.detected(tmp_path / "infiniband-roce-nccl1131", 0).read_text())["format"] == detect.FORMAT
    drift = detections.drift(a, b)
    assert [(d.what, d.recorded, d.now) for d in drift] == [
        ("detected NCCL_IB_GID_INDEX (rank 0)", "3 [gid_index]", "7 [gid_index]")]
    assert detections.drift(a, a) == []
    assert detections.collect(tmp_path / "nowhere") is None


def test_every_detector_is_documented() -> None:
    """docs/detectors.md has a row for each detector and names each variable it may set."""
    doc = (REPO / "docs" / "detectors.md").read_text()
    for name, detector in detect.DETECTORS.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        for variable in detector.variables:
            assert f"`{variable}`" in row, (name, variable)


def test_a_spec_names_known_detectors_only(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    shutil.copyfile(REPO / "specs/tiny.yaml", tmp_path / "tiny.yaml")
    spec.write_text("extends: tiny.yaml\nenv:\n  detect: [ib_hca, gid_indx]\n")
    bad = mxc("build", str(spec), cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert (f"{spec}:3: env.detect: unknown detector 'gid_indx' (did you mean 'gid_index'? one of ib_hca, "
            "gid_index, ainic_tc, socket_ifname, dmabuf)") in bad.stderr.splitlines()
    assert not (mxc_home / "bundles").exists() or not any((mxc_home / "bundles").iterdir())
    spec.write_text("extends: tiny.yaml\nenv:\n  detect: [dmabuf, dmabuf]\n")
    twice = mxc("build", str(spec), cwd=tmp_path)
    assert twice.returncode == 2 and "env.detect: a detector is named twice" in twice.stderr
    spec.write_text("extends: tiny.yaml\nenv:\n  detect: [socket_ifname, dmabuf]\n")
    good = mxc("build", str(spec), "-q", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    run_json = json.loads((mxc_home / "bundles" / good.stdout.strip() / "run.json").read_text())
    assert run_json["detect"] == ["socket_ifname", "dmabuf"]  # in the spec's order, the order they run in


# ---- in a container: the image's environment is the base


def test_in_a_container_detection_fills_what_the_image_leaves_unset_and_the_guard_still_lowers() -> None:
    found = {"NCCL_DMABUF_ENABLE": "1", "NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_GID_INDEX": "3"}
    image = {"NCCL_DMABUF_ENABLE": "0", "NCCL_IB_HCA": "=mlx5_1"}
    modes = detect.container_modes(found)
    joined = envmerge.apply(image, [(name, value, modes[name]) for name, value in found.items()])
    # the image's deliberate 0 is never raised to 1, its HCA list is kept, the unset GID index is filled
    assert joined == {"NCCL_DMABUF_ENABLE": "0", "NCCL_IB_HCA": "=mlx5_1", "NCCL_IB_GID_INDEX": "3"}
    guard = detect.container_modes({"NCCL_DMABUF_ENABLE": "0"})["NCCL_DMABUF_ENABLE"]
    lowered = envmerge.apply({"NCCL_DMABUF_ENABLE": "1"}, [("NCCL_DMABUF_ENABLE", "0", guard)])
    assert lowered == {"NCCL_DMABUF_ENABLE": "0"}


def test_a_corrupt_packed_kernel_config_reads_as_unreadable(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    set_kernel(root, "6.8.0-107-generic", None)
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/config.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)  # a gzip header, then garbage
    found = detect.detect_dmabuf(detect.Node(root))
    assert found.values == {"NCCL_DMABUF_ENABLE": "0"} and found.reason.startswith("kernel config unreadable")
