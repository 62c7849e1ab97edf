"""Property-based fuzzing of spec input: loader, resolver (extends, --set) and validator.

Whatever the text, the pipeline returns a Bundle or raises SpecErrors (exit 2, one line per
problem), never anything else. Inputs: mutations of the shipped specs (characters, bytes, YAML
tokens known to have crashed PyYAML or Python below it, lines duplicated or dropped), random
YAML-ish text, random ``--set`` values. Deterministic (``derandomize``, no example database), so CI
runs the same examples every time; a handful go through the real CLI to prove exit 2, no
traceback and nothing written under MXC_HOME.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxc.compiler import Bundle, compile_spec
from mxc.compiler.errors import SpecErrors
from mxc.compiler.resolve import Reader
from tests.conftest import REPO, store_snapshot

SPECS = REPO / "specs"
SHIPPED: dict[str, bytes] = {str(p.relative_to(SPECS)): p.read_bytes() for p in sorted(SPECS.rglob("*.yaml"))}
MAINS = sorted(name for name in SHIPPED if "/" not in name)  # the runnable specs (not base/ or matrix/)

# Fragments that crashed or fooled the loader once (issue 12), and YAML's sharp edges.
TOKENS = [
    "!x ", "!!python/object/apply:os.system ", "!!bool ", "!!int ", "!!float ", "!!binary ", "!!set ", "! ",
    "&a ", "*a", "<<: ", "? ", "[", "]", "{", "}", ": ", "- ", ", ", "'", '"', "#", "|\n", ">-\n", "---\n", "...\n",
    "%YAML 1.1\n", '"\\0"', '"\\e[2J"', '"\\ud800"', '"\\x85"', "\t", "\r", "\x85", "\u2028", "\u202e", "\x00",
    "\x1b", "\ufeff", "\ud800", "~", "null", "=", "9" * 5000, "9" * 21, "0x" + "f" * 40, "1:2:3:4", ".nan", ".inf",
    "-.inf", "1.0e+400", "2020-13-45", "1_000", "0b101", "[" * 50, "{a: " * 30, "x" * 300,
    "extends: /etc/passwd\n", "extends: ../../x.yaml\n", "extends: [base/rocm.yaml, base/rocm.yaml]\n",
    "extends: 70b.yaml\n", "\nenv:\n  vars:\n    BASH_ENV: x\n", "\n  LD_PRELOAD: /x.so\n", "jax_cache_dir: /x\n",
    "mounts: ['/a:/a,/etc']\n", "allow_dangerous: [PATH]\n",
]
KEYS = [
    "name", "description", "schema", "extends", "restart.max", "checkpoint.period", "checkpoint.dir", "resources.nodes",
    "resources.time", "resources.partition", "runtime.mounts", "runtime.python", "runtime.backend", "env.vars.A",
    "env.vars.LD_PRELOAD", "env.vars.BASH_ENV", "env.allow_dangerous", "env.xla_flags.xla_x", "model.overrides.steps",
    "model.overrides.jax_cache_dir", "model.model_name", "code.repo", "notify.format", "observability.plugins",
]
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _reader(files: dict[str, bytes]) -> Reader:
    def read(path: str) -> bytes:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    return read


def outcome(files: dict[str, bytes], main: str, overrides: tuple[str, ...] = ()) -> Bundle | SpecErrors:
    """A Bundle or the SpecErrors; any other exception fails the test (that is the property)."""
    try:
        return compile_spec(main, _reader(files), overrides, mxc_version="fuzz")
    except SpecErrors as exc:
        for error in exc.errors:
            assert "\n" not in str(error) and "\x1b" not in str(error), str(error)
        return exc


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Choices(Protocol):
    """Where a mutation's random choices come from: hypothesis (shrinkable) or a seeded Random (CLI cases)."""

    def pick(self, options: list[str]) -> str: ...
    def number(self, low: int, high: int) -> int: ...
    def text(self) -> str: ...
    def junk(self) -> bytes: ...


@dataclass
class Seeded:
    rng: random.Random

    def pick(self, options: list[str]) -> str:
        return options[self.rng.randrange(len(options))]

    def number(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def text(self) -> str:
        return "".join(chr(self.rng.randint(0, 0x10FFFF)) for _ in range(self.rng.randint(1, 6)))

    def junk(self) -> bytes:
        return bytes(self.rng.randint(0, 255) for _ in range(self.rng.randint(1, 4)))


@dataclass
class Drawn:
    draw: st.DrawFn

    def pick(self, options: list[str]) -> str:
        return self.draw(st.sampled_from(options))

    def number(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def text(self) -> str:
        return self.draw(st.text(max_size=8))

    def junk(self) -> bytes:
        return self.draw(st.binary(min_size=1, max_size=4))


def mutate(choose: Choices, text: bytes) -> bytes:
    """One edit of ``text``: a YAML token, random characters or bytes, a dropped, duplicated or moved line."""
    pos = choose.number(0, len(text))
    op = choose.pick(["token", "token", "chars", "bytes", "drop", "dup", "swap"])
    if op == "token":
        return text[:pos] + _encode(choose.pick(TOKENS)) + text[pos:]
    if op == "chars":
        return text[:pos] + _encode(choose.text()) + text[pos:]
    if op == "bytes":
        return text[:pos] + choose.junk() + text[pos:]
    lines = text.split(b"\n")
    i, j = choose.number(0, len(lines) - 1), choose.number(0, len(lines) - 1)
    if op == "drop":
        del lines[i]
    elif op == "dup":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


@st.composite
def mutated_specs(draw: st.DrawFn) -> tuple[dict[str, bytes], str]:
    main = draw(st.sampled_from(MAINS))
    files = dict(SHIPPED)
    target = draw(st.sampled_from([main, "base/rocm.yaml", "base/cuda.yaml"]))
    text = files[target]
    for _ in range(draw(st.integers(1, 4))):
        text = mutate(Drawn(draw), text)
    files[target] = text
    return files, main


@FUZZ
@given(mutated_specs())
def test_mutated_shipped_specs_build_or_fail_with_spec_errors(case: tuple[dict[str, bytes], str]) -> None:
    files, main = case
    outcome(files, main)


YAMLISH = st.lists(st.sampled_from(list("abcxyz019 :-_.,[]{}'\"!&*?|>#%@`~\\\n\t") + TOKENS), max_size=80).map("".join)


@FUZZ
@given(YAMLISH)
def test_random_text_builds_or_fails_with_spec_errors(text: str) -> None:
    outcome({"spec.yaml": _encode("schema: mxc/v1\n" + text), **SHIPPED}, "spec.yaml")


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=20),
                          st.sampled_from(TOKENS) | st.text(max_size=30)), min_size=1, max_size=3))
def test_random_set_values_build_or_fail_with_spec_errors(settings_: list[tuple[str, str]]) -> None:
    overrides = tuple(f"{key}={value}" for key, value in settings_ if "\x00" not in key + value)  # argv has no NUL
    outcome(SHIPPED, "tiny.yaml", overrides)


CLI_TOKENS = ["!x ", "\x00", "9" * 5000, "[" * 50, '"\\ud800"', "<<: ", "\u2028", '"\\e[2J"']


def _bad_mutations(count: int) -> list[tuple[bytes, SpecErrors]]:
    """``count`` seeded mutations of tiny.yaml, each with a line holding a token that once crashed
    the loader, that fail in-process; with their errors."""
    rng = random.Random(12)
    found: list[tuple[bytes, SpecErrors]] = []
    while len(found) < count:
        lines = SHIPPED["tiny.yaml"].split(b"\n")
        lines.insert(rng.randrange(len(lines)), _encode("description: " + CLI_TOKENS[len(found) % len(CLI_TOKENS)]))
        text = mutate(Seeded(rng), b"\n".join(lines))
        result = outcome({**SHIPPED, "tiny.yaml": text}, "tiny.yaml")
        if isinstance(result, SpecErrors):
            found.append((text, result))
    return found


@pytest.mark.parametrize("index", range(len(CLI_TOKENS)))
def test_cli_exit_2_one_line_per_problem_and_nothing_written(index: int, tmp_path: Path) -> None:
    text, expected = _bad_mutations(len(CLI_TOKENS))[index]
    home = tmp_path / "home"
    for name, data in {**SHIPPED, "tiny.yaml": text}.items():  # the same files as in-process
        (tmp_path / "specs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "specs" / name).write_bytes(data)
    out = subprocess.run([sys.executable, "-m", "mxc", "build", "specs/tiny.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "MXC_HOME": str(home)}, errors="replace")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == len(expected.errors) + 1 and lines[-1].endswith("nothing was written"), out.stderr
    assert store_snapshot(home) == []


# ---- the importer's inputs (issue 25): file names and contents of a MaxText-Slurm checkout ---------

IMPORT_FIXTURES = REPO / "tests" / "fixtures" / "maxtext_slurm"
SHELLISH = st.lists(st.sampled_from([
    *"abcXYZ_019 =:-.,'\"$`\\{}()[];&|<>#!\n\t", "export ", "XLA_FLAGS=\"$XLA_FLAGS --xla_x=1\"", "if [ x ]; then\n",
    "fi\n", "f() {\n", "}\n", "<<EOF\n",
    "EOF\n", "source x\n", "${A:-b}", "$(cmd)", "\\\n", "NCCL_DEBUG=WARN\n", "\u2028", "\x85", "\x1b[2J", "\x00",
]), max_size=60).map("".join)
ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
ANY_TEXT = st.text(max_size=40)


@FUZZ
@given(SHELLISH)
def test_env_files_are_parsed_or_reported_never_crash(text: str) -> None:
    from mxc.importers import maxtext_slurm as ms

    result = ms.parse_env("train_env.sh", text)
    lines = max(1, len(text.splitlines()))
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in result.vars)
    assert all(1 <= s.line <= lines or s.text == "..." for s in result.skipped)


@FUZZ
@given(config=ANY_TEXT, model=ANY_TEXT, image=ANY_TEXT, digest=ANY_TEXT, source=ANY_TEXT,
       env_vars=st.dictionaries(ENV_NAME, ANY_TEXT, max_size=4), flags=st.dictionaries(ENV_NAME, ANY_TEXT, max_size=3))
def test_imported_specs_load_back_as_intended(config: str, model: str, image: str, digest: str, source: str,
                                              env_vars: dict[str, str], flags: dict[str, str]) -> None:
    """Whatever the names and values, the spec the importer writes loads back to exactly them: no key
    added, none changed (PyYAML, the library mxc's loader uses; mxc's loader then loads the same data or
    refuses a character it never accepts, as one SpecErrors)."""
    import yaml

    from mxc.compiler.loader import load_yaml
    from mxc.importers import maxtext_slurm as ms

    xla = {f"xla_{k.lower()}": v for k, v in flags.items()}
    env = ms.EnvImport(vars=env_vars, xla_flags=xla, sources=[source])
    env.skipped.append(ms.Skipped(source, 1, config, model))
    inputs = ms.SpecInputs(name="n", config_name=config, config_source=source, image=image, digest=digest or None,
                           facts=ms.ConfigFacts(model_name=model, checkpoint_period=0, nodes=1, keys=0), env=env,
                           nodes=1, container="podman")
    text = ms.spec_text(inputs)
    loaded = yaml.safe_load(text)
    assert set(loaded) == {"schema", "name", "description", "image", "code", "model", "env", "resources", "runtime"}
    assert loaded["image"] == ({"ref": image, "digest": digest} if digest else {"ref": image})
    assert loaded["model"] == {"model_name": model, "config_file": config}
    assert (loaded["env"] or {}) == {**({"vars": env_vars} if env_vars else {}), **({"xla_flags": xla} if xla else {})}
    with contextlib.suppress(SpecErrors):  # mxc's loader refuses some characters outright (NEL, U+2028, ...)
        assert load_yaml("s.yaml", text).data == loaded


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
       | st.text(st.characters(codec="utf-8", blacklist_characters="/\x00"), min_size=1, max_size=30),
       config=st.sampled_from(["", "model_name: x\n", "steps: 3\n", "[1, 2]\n", "a: !!python/name:os.system\n",
                               "\u2028: 1\n", "base_output_directory: /x\n"]),
       env_text=SHELLISH)
def test_the_importer_writes_a_spec_or_one_error_for_any_file_name_and_content(
        name: str, config: str, env_text: str) -> None:
    """The real command, in-process, on a checkout whose config file name, config text and env file are
    arbitrary: exit 0 with a spec whose config_file is that name and a verbatim copy, or exit 2 with
    nothing written; never a traceback."""
    import io
    import tempfile

    import yaml

    from mxc.cli.main import main

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / ".git").mkdir(parents=True)
        (repo / "configs").mkdir()
        config_path = repo / "configs" / (name + ".gpu.yml")
        if len(os.fsencode(config_path.name)) > 255:
            return
        text = (IMPORT_FIXTURES / "configs" / "llama2-70b.gpu.yml").read_text() + config
        config_path.write_text(text, encoding="utf-8", errors="surrogatepass")
        (repo / "train_env.sh").write_text(env_text, encoding="utf-8", errors="surrogatepass")
        out = Path(tmp) / "specs" / "s.yaml"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["import", "maxtext-slurm", str(config_path), "--env", str(repo / "train_env.sh"),
                         "-o", str(out), "--digest", "sha256:" + "ab" * 32])
        assert code in (0, 2), err.getvalue()
        if code == 2:
            assert not out.exists() and not (out.parent / config_path.name).exists()
            assert err.getvalue().count("\n") >= 1 and "Traceback" not in err.getvalue()
            return
        assert yaml.safe_load(out.read_text())["model"]["config_file"] == config_path.name
        assert (out.parent / config_path.name).read_text() == text
