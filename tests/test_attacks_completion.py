"""Shell completion never evaluates data (issue 25): a run directory's name is data, written by
whoever can write the runs root (a shared file system), and reaches the shell of whoever presses Tab.

bash's ``compgen -W WORDLIST`` expands every word of its list (parameter, command and arithmetic
expansion), so a directory named ``$(touch${IFS}x)`` ran ``touch x`` when the victim pressed Tab after
``mxc logs ``. Each shell is driven as on a real Tab (bash: the completion function with COMP_WORDS;
fish: ``complete -C``; zsh: the completer inside a completion widget, through a pseudo-terminal) in a
home whose runs root holds hostile names next to two real runs: nothing runs, and only the real run
ids and bundle prefixes are offered, as literal words.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc

BIN = str(Path(sys.executable).parent)
RUNS = ("20260101-000000-aaaa-2f09e67f", "20260102-000000-bbbb-2f09e67f")
# Each would create a file named pwned-* in the shell's working directory if the shell evaluated it.
HOSTILE = (
    "$(touch${IFS}pwned-dollar)",
    "`touch pwned-backtick`",
    "$(touch pwned-space)",
    "20260103-000000-cccc-2f09e67f$(touch${IFS}pwned-suffix)",
    "it's",
    'a"quote',
    "two words",
    "20260104-000000-dddd-2f09e67f\n20260105-000000-eeee-2f09e67f",  # a newline: two fake ids
    "${HOME}",
    "*",
    "$((1+1))",
    "-rf",
)


@pytest.fixture
def hostile_home(mxc: Mxc, mxc_home: Path) -> tuple[Path, str]:
    out = mxc("build", str(REPO / "specs/tiny.yaml"), "-q")
    assert out.returncode == 0, out.stderr
    for name in (*RUNS, *HOSTILE):
        (mxc_home / "runs" / name).mkdir(parents=True)
    return mxc_home, out.stdout.strip()[:12]


def run_shell(argv: list[str], home: Path, cwd: Path, script: str) -> str:
    env = {**os.environ, "MXC_HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "MXC_COMPLETION_SCRIPT": script, "HOME": str(cwd)}
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def script_of(mxc: Mxc, shell: str) -> str:
    out = mxc("completion", shell)
    assert out.returncode == 0, out.stderr
    return out.stdout


def nothing_ran(cwd: Path) -> None:
    assert sorted(p.name for p in cwd.iterdir() if p.name.startswith("pwned")) == []


@pytest.mark.parametrize("words, prefix", [(("logs",), ""), (("cancel",), "2026"), (("rm",), "")])
def test_bash_completion_runs_nothing_from_a_run_directorys_name(
        mxc: Mxc, hostile_home: tuple[Path, str], tmp_path: Path, words: tuple[str, ...], prefix: str) -> None:
    home, bundle = hostile_home
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    all_words = ("mxc", *words, prefix)
    line = " ".join(all_words)
    code = ('eval "$MXC_COMPLETION_SCRIPT"\n'
            f"COMP_WORDS=({' '.join(repr(w) for w in all_words)}); COMP_CWORD={len(all_words) - 1}; "
            f"COMP_LINE={line!r}; COMP_POINT={len(line)}\n"
            f"_shtab_mxc mxc {prefix!r} {words[-1]!r}\n"
            'printf "%s\\0" "${COMPREPLY[@]}"')
    offered = [w for w in run_shell(["bash", "-c", code], home, cwd, mxc("completion", "bash").stdout).split("\0") if w]
    nothing_ran(cwd)
    expected = {"logs": [*RUNS, bundle], "cancel": list(RUNS), "rm": [*RUNS, bundle]}[words[0]]
    assert sorted(offered) == sorted(expected)


def test_fish_completion_offers_only_run_ids_and_runs_nothing(
        mxc: Mxc, hostile_home: tuple[Path, str], tmp_path: Path) -> None:
    assert shutil.which("fish"), "fish is not installed: scripts/setup.sh --test installs it"
    home, bundle = hostile_home
    script = script_of(mxc, "fish")
    for line, expected in [("mxc logs ", [*RUNS, bundle]), ("mxc cancel 2026", list(RUNS))]:
        out = run_shell(["fish", "--no-config", "-c", f'echo "$MXC_COMPLETION_SCRIPT" | source; complete -C "{line}"'],
                        home, tmp_path, script)
        offered = [row.split("\t")[0] for row in out.splitlines()]
        assert sorted(offered) == sorted(expected), line
    nothing_ran(tmp_path)


# zsh: a real Tab in an interactive zsh on a pseudo-terminal (zsh/zpty), the approach of
# github.com/Valodim/zsh-capture-completion: the completion system runs as on a keyboard and calls
# mxc's completer inside its widget; a compadd wrapper lets the builtin do the matching (-A) and
# prints each match it would insert, quoted, so that a newline or a space in a match shows.
ZSH_CAPTURE = r"""
PROMPT=
fpath=($MXC_ZSH_FPATH $fpath)
autoload -U compinit && compinit -u -D
bindkey '^I' complete-word
comppostfuncs=(exit)
compadd() {
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi
  local -a __hits
  builtin compadd -A __hits "$@"
  local hit
  for hit in $__hits; do print -r -- "MATCH ${(q+)hit}"; done
}
print -r -- CAPTURE-READY
"""
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "source ${0:h}/capture.zsh"
local line
repeat 50; do zpty -r z line; [[ $line == CAPTURE-READY* ]] && break; done
zpty -w z "$1"$'\t'
while zpty -r z line; do print -r -- "$line"; done
zpty -d z
"""


def zsh_matches(home: Path, cwd: Path, script: str, line: str) -> list[str]:
    """What a Tab at the end of ``line`` offers in an interactive zsh (each match as zsh would insert it)."""
    (cwd / "fpath").mkdir(exist_ok=True)
    (cwd / "fpath" / "_mxc").write_text(script)
    (cwd / "capture.zsh").write_text(ZSH_CAPTURE)
    (cwd / "drive.zsh").write_text(ZSH_DRIVER)
    env = {**os.environ, "MXC_HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "MXC_ZSH_FPATH": str(cwd / "fpath"), "HOME": str(cwd)}
    out = subprocess.run(["zsh", "-f", str(cwd / "drive.zsh"), line], cwd=cwd, env=env, capture_output=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode("utf-8", "replace")
    return [row.split("MATCH ", 1)[1].rstrip("\r") for row in text.splitlines() if "MATCH " in row]


def test_zsh_completion_offers_only_run_ids_and_runs_nothing(
        mxc: Mxc, hostile_home: tuple[Path, str], tmp_path: Path) -> None:
    assert shutil.which("zsh"), "zsh is not installed: scripts/setup.sh --test installs it"
    home, bundle = hostile_home
    script = script_of(mxc, "zsh")
    assert sorted(zsh_matches(home, tmp_path, script, "mxc logs ")) == sorted([*RUNS, bundle])
    assert sorted(zsh_matches(home, tmp_path, script, "mxc cancel 2026")) == sorted(RUNS)
    nothing_ran(tmp_path)
