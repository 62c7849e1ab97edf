"""`mxc completion bash|zsh|fish`: the scripts are loaded into the real shells and asked, as the
shell would ask on Tab, for subcommands, options, the run ids of a test MXC_HOME and its bundles'
hash prefixes. bash is always there; zsh and fish are asked where installed (Debian's `zsh`,
`fish` packages; scripts/test.sh installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc

RUNS = ("20260101-000000-aaaa-2f09e67f", "20260102-000000-bbbb-2f09e67f")
BIN = str(Path(sys.executable).parent)  # where the test environment's `mxc` is: the scripts call it


@pytest.fixture
def home(mxc: Mxc, mxc_home: Path) -> tuple[Path, str]:
    """A home with two runs and one bundle; the bundle's 12-hex prefix."""
    out = mxc("build", str(REPO / "specs/tiny.yaml"), "-q")
    assert out.returncode == 0, out.stderr
    for run in RUNS:
        (mxc_home / "runs" / run).mkdir(parents=True)
    return mxc_home, out.stdout.strip()[:12]


def shell(argv: list[str], home: Path, script: str) -> str:
    """Run a shell with the test's MXC_HOME and `mxc`; the script is in $MXC_COMPLETION_SCRIPT."""
    env = {**os.environ, "MXC_HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "MXC_COMPLETION_SCRIPT": script}
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def script_of(mxc: Mxc, name: str) -> str:
    out = mxc("completion", name)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out.stdout


def bash_complete(home: Path, script: str, *words: str) -> list[str]:
    """COMPREPLY after Tab at the end of ``mxc WORDS...`` (the last word is the one being completed)."""
    line = " ".join(("mxc", *words))
    quoted = " ".join(f"'{w}'" for w in ("mxc", *words))
    code = (f'eval "$MXC_COMPLETION_SCRIPT"\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words)}; '
            f"COMP_LINE='{line}'; COMP_POINT={len(line)}\n"
            f"_shtab_mxc mxc '{words[-1]}' '{words[-2] if len(words) > 1 else 'mxc'}'\n"
            'printf "%s\\n" "${COMPREPLY[@]}"')
    return shell(["bash", "-c", code], home, script).split()


def test_bash_completes_commands_options_runs_and_bundles(mxc: Mxc, home: tuple[Path, str]) -> None:
    root, prefix = home
    script = script_of(mxc, "bash")
    assert sorted(bash_complete(root, script, "lo")) == ["lock", "logs"]
    assert "completion" in bash_complete(root, script, "")
    assert {"--rank", "--grep", "--tail", "--since", "--config"} <= set(bash_complete(root, script, "logs", "--"))
    assert bash_complete(root, script, "cancel", "2026") == list(RUNS)
    assert bash_complete(root, script, "triage", "20260102") == [RUNS[1]]
    assert bash_complete(root, script, "show", "") == [prefix]
    assert bash_complete(root, script, "runs", "--bundle", prefix[:3]) == [prefix]
    assert sorted(bash_complete(root, script, "logs", "")) == sorted([*RUNS, prefix])  # a run, or a bundle's latest run
    assert bash_complete(root, script, "completion", "") == ["bash", "zsh", "fish"]


def test_bash_completion_of_an_empty_home_is_empty(mxc: Mxc, mxc_home: Path) -> None:
    script = script_of(mxc, "bash")
    assert bash_complete(mxc_home, script, "logs", "") == []
    assert bash_complete(mxc_home, script, "show", "") == []


def test_zsh_script_parses_registers_and_lists(mxc: Mxc, home: tuple[Path, str], tmp_path: Path) -> None:
    assert shutil.which("zsh"), "zsh is not installed: scripts/setup.sh --test installs it (apt-get install zsh)"
    root, prefix = home
    script = script_of(mxc, "zsh")
    assert script.startswith("#compdef mxc")
    path = tmp_path / "_mxc"
    path.write_text(script)
    subprocess.run(["zsh", "-n", str(path)], check=True, timeout=60)
    # compadd only works inside a completion widget: a stand-in prints what it is handed
    code = ('autoload -U compinit && compinit -u -D\neval "$MXC_COMPLETION_SCRIPT"\n'
            'print -r -- "registered: $_comps[mxc]"\n'
            'compadd() { [[ $1 == -a ]] && print -rl -- ${(P)2}; }\n'
            "_mxc_complete_runs; print -r -- --; _mxc_complete_bundles")
    out = shell(["zsh", "-f", "-c", code], root, script).splitlines()
    assert out == ["registered: _shtab_mxc", *RUNS, "--", prefix]


def test_fish_completes_commands_runs_and_bundles(mxc: Mxc, home: tuple[Path, str], tmp_path: Path) -> None:
    assert shutil.which("fish"), "fish is not installed: scripts/setup.sh --test installs it (apt-get install fish)"
    root, prefix = home
    script = script_of(mxc, "fish")
    path = tmp_path / "mxc.fish"
    path.write_text(script)
    subprocess.run(["fish", "-n", str(path)], check=True, timeout=60)

    def complete(line: str) -> list[str]:
        out = shell(["fish", "-c", f'echo "$MXC_COMPLETION_SCRIPT" | source; complete -C "{line}"'], root, script)
        return [row.split("\t")[0] for row in out.splitlines()]

    assert complete("mxc lo") == ["lock", "logs"]
    assert complete("mxc cancel 2026") == list(RUNS)
    assert complete(f"mxc show {prefix[:4]}") == [prefix]
    assert "--since" in complete("mxc logs --si")


def test_completion_needs_a_known_shell(mxc: Mxc) -> None:
    out = mxc("completion", "tcsh")
    assert out.returncode == 2 and "invalid choice: 'tcsh'" in out.stderr


def test_help_has_an_example(mxc: Mxc) -> None:
    out = mxc("completion", "--help")
    assert out.returncode == 0 and "example:\n  mxc completion bash" in out.stdout
