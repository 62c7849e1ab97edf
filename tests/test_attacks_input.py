"""The hostile-spec corpus: every attack on spec input found by the security review (issue 12),
each reproduced and shown to end as one clear line and exit 2 (or an opt-in that is reported).

In-process where the pure compiler decides (fast); through the real CLI where the edge does
(files on disk, exit codes, what reaches stderr, CI annotations, the store).
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mxc.compiler import compile_spec
from mxc.compiler.errors import SpecErrors
from tests.conftest import REPO, Mxc, store_snapshot

TINY = (REPO / "specs" / "tiny.yaml").read_text()
SECRET = "hunter2-do-not-echo"


def compile_files(files: dict[str, str | bytes], main: str = "spec.yaml", overrides: tuple[str, ...] = ()) -> object:
    """Compile ``main`` from in-memory files (the pure compiler, no disk)."""

    def read(path: str) -> bytes:
        if path not in files:
            raise FileNotFoundError(path)
        data = files[path]
        return data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data

    return compile_spec(main, read, overrides, mxc_version="test")


def errors_of(files: dict[str, str | bytes], main: str = "spec.yaml", overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        compile_files(files, main, overrides)
    return [str(e) for e in info.value.errors]


def tiny_with(extra: str) -> dict[str, str | bytes]:
    """tiny.yaml as a parent, and a spec that extends it with ``extra`` (YAML text)."""
    return {"tiny.yaml": TINY, "spec.yaml": "extends: tiny.yaml\n" + extra}


def assert_refused(result: object, *patterns: str) -> None:
    """Exit 2, no traceback, one line per problem plus the summary line, each pattern on a line."""
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert lines[-1].endswith("nothing was written"), stderr
    for pattern in patterns:
        assert any(re.search(pattern, line) for line in lines), (pattern, stderr)


# ---- 1. environment variables that shells, loaders and container runtimes obey -------------------

@pytest.mark.parametrize("name", [
    "BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GLOBIGNORE",
    "BASH_FUNC_log", "SLURM_PROCID", "APPTAINERENV_BASH_ENV",
])
def test_variables_bash_or_slurm_act_on_are_refused_without_opt_in(name: str) -> None:
    errors = errors_of(tiny_with(f"env:\n  vars:\n    {name}: '$(touch /tmp/pwned)'\n"))
    assert errors == [f"spec.yaml:4: env.vars.{name}: {name} is refused: bash, Slurm or mxc act on it before "
                      "training starts (it can run commands or change what the scripts do)"]
    # ...and no opt-in makes them acceptable
    errors = errors_of(tiny_with(f"env:\n  allow_dangerous: [{name}]\n  vars:\n    {name}: x\n"))
    assert any(f"env.vars.{name}: {name} is refused" in e for e in errors), errors


@pytest.mark.parametrize("name", [
    "LD_PRELOAD", "LD_AUDIT", "GLIBC_TUNABLES", "GCONV_PATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT",
    "PERL5OPT", "NODE_OPTIONS", "PATH", "HOME", "APPTAINER_BIND", "SINGULARITY_CONTAINLIBS", "APPTAINERENV_LD_PRELOAD",
    "CONTAINERS_CONF", "CONTAINER_HOST",
])
def test_loader_interpreter_and_container_variables_need_the_opt_in(name: str) -> None:
    errors = errors_of(tiny_with(f"env:\n  vars:\n    {name}: /tmp/evil.so\n"))
    assert len(errors) == 1 and errors[0].startswith(f"spec.yaml:4: env.vars.{name}: {name} makes the loader"), errors
    assert "env.allow_dangerous" in errors[0]
    bundle = compile_files(tiny_with(f"env:\n  allow_dangerous: [{name}]\n  vars:\n    {name}: /tmp/evil.so\n"))
    spec_json = json.loads(bundle.files["spec.json"])  # type: ignore[attr-defined]
    assert spec_json["env"]["allow_dangerous"] == [name]  # the opt-in travels in the bundle


@pytest.mark.parametrize("name, value, ok", [
    ("LD_LIBRARY_PATH", "/opt/rocm/lib:/usr/local/lib", True),
    ("PYTHONPATH", "/site/python", True),
    ("LD_LIBRARY_PATH", ":/opt/rocm/lib", False),  # empty entry: the working directory
    ("LD_LIBRARY_PATH", "/opt/rocm/lib:", False),
    ("PYTHONPATH", "src", False),
    ("APPTAINERENV_LD_LIBRARY_PATH", "lib", False),
])
def test_search_paths_are_allowed_with_absolute_entries_only(name: str, value: str, ok: bool) -> None:
    files = tiny_with(f"env:\n  vars:\n    {name}: {json.dumps(value)}\n")
    if ok:
        compile_files(files)
    else:
        (error,) = errors_of(files)
        assert f"env.vars.{name}: {name}: " in error and "is not an absolute directory" in error


def test_opt_in_must_name_a_variable_that_is_set_and_needs_it() -> None:
    (unused,) = errors_of(tiny_with("env:\n  allow_dangerous: [LD_PRELOAD]\n"))
    assert unused == ("spec.yaml:3: env.allow_dangerous: env.allow_dangerous lists LD_PRELOAD, which neither env.vars "
                      "sets nor env.pass passes (remove it)")
    (needless,) = errors_of(tiny_with("env:\n  allow_dangerous: [NCCL_DEBUG]\n  vars:\n    NCCL_DEBUG: WARN\n"))
    assert "lists NCCL_DEBUG, which needs no opt-in (remove it)" in needless


def test_bash_env_payload_is_refused_by_build_and_check(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The reviewed attack: BASH_ENV ran its command when bash started preflight.sh; `mxc check` said ok."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"extends: tiny.yaml\nenv:\n  vars:\n    BASH_ENV: '$(touch {tmp_path}/pwned)'\n")
    assert_refused(mxc("build", str(spec)), r"spec\.yaml:4: env\.vars\.BASH_ENV: BASH_ENV is refused")
    out = mxc("check", str(spec), "--format", "github")
    assert out.returncode == 1
    assert re.search(r"^::error file=[^,]*spec\.yaml,line=4,title=mxc check%3A schema::env\.vars\.BASH_ENV: BASH_ENV "
                     r"is refused", out.stdout, re.M), out.stdout
    assert store_snapshot(mxc_home) == [] and not (tmp_path / "pwned").exists()


def test_opt_in_is_reported_by_build_show_and_check(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    spec = tmp_path / "spec.yaml"
    spec.write_text("extends: tiny.yaml\nenv:\n  allow_dangerous: [LD_PRELOAD]\n  vars:\n"
                    "    LD_PRELOAD: /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4\n")
    built = mxc("build", str(spec))
    assert built.returncode == 0, built.stderr
    notice = "env.allow_dangerous: LD_PRELOAD exported on purpose"
    assert f"mxc: warning: {notice}" in built.stderr
    shown = mxc("show", built.stdout.strip()[:12])
    assert f"warning: {notice}" in shown.stdout and '"allow_dangerous": [' in shown.stdout
    checked = mxc("check", str(spec))
    assert checked.returncode == 0  # the opt-in is the reviewed decision: shown on every check, never silent
    assert re.search(r"spec\.yaml:5: env\.vars\.LD_PRELOAD: note\[env-dangerous\]: LD_PRELOAD='/usr/lib/.*' is "
                     r"exported on purpose", checked.stdout), checked.stdout


def test_a_spec_without_opt_in_keeps_its_bundle_hash() -> None:
    """allow_dangerous appears in spec.json only when used: existing bundles keep their hashes."""
    bundle = compile_files({"spec.yaml": TINY})
    assert "allow_dangerous" not in bundle.files["spec.json"]  # type: ignore[attr-defined]


# ---- 2. extends reads only the spec's repository, regular files, bounded ----------------------

@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the spec's directory holding a 'secret' a bad error message would echo."""
    secret_dir = tmp_path / "home"
    secret_dir.mkdir()
    secret = secret_dir / "credentials"
    secret.write_text(f"{SECRET}: yes\naws_secret: {SECRET}\n")
    return secret


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A spec directory (not a git work tree) with tiny.yaml in it."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "tiny.yaml").write_text(TINY)
    return root


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_extends_outside_the_repository_is_refused_before_reading(
        how: str, mxc: Mxc, mxc_home: Path, project: Path, outside: Path) -> None:
    if how == "dotdot":
        target = "../home/credentials"
    elif how == "absolute":
        target = str(outside)
    else:
        (project / "base.yaml").symlink_to(outside)
        target = "base.yaml"
    spec = project / "spec.yaml"
    spec.write_text(f"extends: [tiny.yaml, {target}]\n")
    result = mxc("build", str(spec))
    why = "an absolute path" if how == "absolute" else "outside the spec's repository"
    assert_refused(result, rf"spec\.yaml:1: extends: .*{why}")
    assert SECRET not in result.stderr
    for fmt in ("github", "junit", "json", "text") if how == "dotdot" else ("github",):
        checked = mxc("check", str(spec), "--format", fmt)
        assert checked.returncode == 1 and SECRET not in checked.stdout + checked.stderr, fmt
    assert store_snapshot(mxc_home) == []


def test_extends_inside_the_git_work_tree_may_climb_out_of_the_spec_directory(tmp_path: Path, outside: Path) -> None:
    from mxc.specfiles import SpecFiles, repository_of

    repo = tmp_path / "repo"
    (repo / "specs" / "team").mkdir(parents=True)
    (repo / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's .git is a file
    (repo / "specs" / "tiny.yaml").write_text(TINY)
    spec = repo / "specs" / "team" / "spec.yaml"
    spec.write_text("extends: ../tiny.yaml\n")
    assert repository_of(spec) == repo.resolve()
    compile_spec(str(spec), SpecFiles.for_spec(spec), mxc_version="test")
    spec.write_text("extends: [../tiny.yaml, ../../../home/credentials]\n")
    with pytest.raises(SpecErrors) as info:
        compile_spec(str(spec), SpecFiles.for_spec(spec), mxc_version="test")
    assert "outside the spec's repository" in str(info.value) and SECRET not in str(info.value)


def test_fifo_device_directory_and_huge_files_are_refused_without_reading(
        mxc: Mxc, mxc_home: Path, project: Path) -> None:
    os.mkfifo(project / "fifo.yaml")  # reading it would block the build forever
    (project / "dir.yaml").mkdir()
    (project / "big.yaml").write_bytes(b"# " + b"x" * (1 << 21) + b"\n")
    for name, why in [("fifo.yaml", "not a regular file"), ("dir.yaml", "not a regular file"),
                      ("big.yaml", "larger than 1,048,576 bytes")]:
        spec = project / "spec.yaml"
        spec.write_text(f"extends: [tiny.yaml, {name}]\n")
        # the timeout only guards the test run; the verdict is the exit code and the message
        assert_refused(mxc("build", str(spec), timeout=300), rf"spec\.yaml:1: extends: \S*{name}: {why}")
    assert_refused(mxc("build", str(project / "fifo.yaml"), timeout=300), r"fifo\.yaml: not a regular file")
    assert store_snapshot(mxc_home) == []


def test_reader_refuses_devices_even_inside_the_root(tmp_path: Path) -> None:
    """/dev/zero exhausted memory: a device is never read, wherever the root is."""
    from mxc.compiler.resolve import ReadRefused
    from mxc.specfiles import SpecFiles

    with pytest.raises(ReadRefused, match="not a regular file"):
        SpecFiles(Path("/dev"))("/dev/zero")


def test_an_extends_bomb_reads_a_bounded_number_of_files() -> None:
    files: dict[str, str | bytes] = {"leaf.yaml": "schema: mxc/v1\n"}
    files["mid.yaml"] = "extends: [" + ", ".join(["leaf.yaml"] * 100) + "]\n"
    files["spec.yaml"] = "extends: [" + ", ".join(["mid.yaml"] * 100) + "]\n"
    (error,) = errors_of(files)
    assert "more than 64 files read through extends" in error


def test_a_sweep_cannot_name_a_spec_outside_its_repository(mxc: Mxc, project: Path, outside: Path) -> None:
    sweep = project / "sweep.yaml"
    sweep.write_text("matrix: mxc/v1\nspec: ../home/credentials\naxes:\n  model.overrides.steps: [1, 2]\n")
    result = mxc("check", "--matrix", str(sweep), "--format", "github")
    assert result.returncode == 1 and "outside the spec's repository" in result.stdout, result.stdout + result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_check_refuses_a_discovered_symlink_to_outside(mxc: Mxc, project: Path, outside: Path) -> None:
    (project / "leak.yaml").symlink_to(outside)
    result = mxc("check", str(project), "--format", "github")
    assert "leak.yaml" in result.stdout and "outside the spec's repository" in result.stdout, result.stdout
    assert SECRET not in result.stdout + result.stderr


# ---- 3/4. loader and validator crashes, NUL and control characters ------------------------------

DEEP = "[" * 5000 + "]" * 5000
CRASHERS: dict[str, tuple[str, str]] = {
    # name: (YAML appended to a spec extending tiny.yaml, expected error, as a regex)
    "raw NUL byte": ("description: a\x00b\n", r"spec\.yaml:2: control character U\+0000 is not allowed in a spec"),
    "NUL escape in a value": ('description: "a\\0b"\n', r"spec\.yaml:2: description: control character U\+0000"),
    "ESC in an env value": ('env:\n  vars:\n    A: "\\e[2J"\n', r"spec\.yaml:4: env\.vars\.A: control character U\+001B"),
    "custom tag": ("description: !x foo\n", r"spec\.yaml:2:\d+: YAML: tags such as '!x' are not allowed"),
    "python tag": ("description: !!python/object/apply:os.system [id]\n", r"YAML: tags such as '!!python/object"),
    "bool tag on garbage": ("restart: {max: !!bool maybe}\n", r"YAML: tags such as '!!bool'"),
    "deep nesting": (f"description: {DEEP}\n", r"spec\.yaml:2:\d+: YAML: nested deeper than 20 levels"),
    "5000-digit integer": ("restart: {max: " + "9" * 5000 + "}\n", r"restart\.max: a number written with more than 80"),
    "21-digit integer": ("restart: {max: " + "9" * 21 + "}\n", r"restart\.max: an integer with more than 20 digits"),
    "huge hex integer": ("restart: {max: 0x" + "f" * 70 + "}\n", r"restart\.max: an integer with more than 20 digits"),
    "lone surrogate": ('description: "\\ud800"\n', r"description: a lone surrogate U\+D800"),
    "non-string key": ("env:\n  vars:\n    1: x\n", r"spec\.yaml:4: env\.vars: keys must be strings, got 1"),
    "complex key": ("? [a]\n: 1\n", r"keys must be strings"),
    "inf where an int is expected": ("restart: {max: .inf}\n", r"restart\.max: expected a finite number, got inf"),
    "nan in an override": ("model:\n  overrides:\n    learning_rate: .nan\n", r"overrides\.learning_rate: expected a finite"),
    "huge float": ("model:\n  overrides:\n    learning_rate: 1.0e+400\n", r"expected a finite number, got inf"),
    "merge key": ("model:\n  <<: {config: x.yml}\n", r"spec\.yaml:3: model: YAML merge keys \(<<\) are not allowed"),
    "YAML value key": ("description: =\n", r"^$"),  # accepted: the string "="
    "U+2028 hides a line": ("# a comment\u2028name: evil\n", r"spec\.yaml:2: a line break YAML sees but editors may not"),
    "lone CR hides a line": ("# a comment\rname: evil\n", r"a line break YAML sees but editors may not \(U\+000D\)"),
    "bidi override": ("description: \u202eevil\n", r"a bidirectional control character \(U\+202E\)"),
    "very long string": ("description: " + "x" * 70_000 + "\n", r"description: a value longer than 65,536 characters"),
    "very long key": ("x" * 300 + ": 1\n", r"a key longer than 256 characters"),
    "too many keys": ("model:\n  overrides:\n" + "".join(f"    k{i}: {i}\n" for i in range(5001)),
                      r"more than 10,000 keys, items and values in one file"),
    "too many digits in a Slurm time": ("resources: {time: '" + "9" * 5000 + "'}\n", r"resources\.time: expected a Slurm"),
}


@pytest.mark.parametrize("case", sorted(CRASHERS))
def test_loader_and_validator_crashers_become_one_line_errors(case: str) -> None:
    extra, pattern = CRASHERS[case]
    files = tiny_with(extra)
    if pattern == r"^$":
        compile_files(files)
        return
    errors = errors_of(files)
    assert any(re.search(pattern, e) for e in errors), errors
    assert all("\n" not in e and "\x1b" not in e and "\x00" not in e for e in errors)


def test_a_big_spec_is_refused_before_parsing(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A 50 MB spec built for 34 s; past 1 MiB nothing is parsed."""
    spec = tmp_path / "big.yaml"
    with spec.open("w") as fh:
        fh.write(TINY)
        for i in range(60_000):
            fh.write(f"# padding line {i:08d} to make the file larger than one mebibyte\n")
    assert_refused(mxc("build", str(spec)), r"big\.yaml: larger than 1,048,576 bytes")
    assert store_snapshot(mxc_home) == []


@pytest.mark.parametrize("setting, pattern", [
    ("description=\x1b[2J", r"--set: description: control character U\+001B in a value"),
    ("description=a\x07b", r"--set: description: control character U\+0007"),
    ("restart.max=" + "9" * 5000, r"--set: restart\.max: a number written with more than 80 characters"),
    ("description=" + "[" * 3000 + "]" * 3000, r"--set: description: nested deeper than 20 levels"),
    ("description=!!python/name:os.system x", r"--set: description: tags such as '!!python/name:os.system'"),
    (".".join(["a"] * 30) + "=1", r"--set: a key path deeper than 20 levels"),
    ("env.vars.A\x1bB=1", r"--set: a key with control character U\+001B"),
    ("env.vars.BASH_ENV=$(id)", r"--set: env\.vars\.BASH_ENV: BASH_ENV is refused"),
])
def test_set_values_obey_the_same_rules(setting: str, pattern: str) -> None:
    errors = errors_of({"spec.yaml": TINY}, overrides=(setting,))
    assert any(re.search(pattern, e) for e in errors), errors
    assert all("\x1b" not in e and "\x07" not in e for e in errors)


def test_cue_export_json_obeys_the_same_rules() -> None:
    """A .cue spec reaches mxc as CUE's JSON export: the same limits and characters apply."""
    from mxc.compiler.loader import load_json

    assert load_json("s.cue", '{"a": {"b": [1, "x"]}}').data == {"a": {"b": [1, "x"]}}
    for text, words in [
        ('{"restart": {"max": ' + "9" * 5000 + "}}", "an integer with more than 20 digits"),
        ('{"restart": {"max": NaN}}', "expected a finite number"),
        ('{"description": "a\\u0000b"}', "control character U+0000"),
        ('{"a\\u001bb": 1}', "a key with control character U+001B"),
        ('{"d": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 20 levels"),
        ('{"d": "\\ud800"}', "a lone surrogate"),
    ]:
        with pytest.raises(SpecErrors) as info:
            load_json("s.cue", text)
        assert words in str(info.value), (text[:40], str(info.value))


def test_check_refuses_a_cue_spec_outside_its_repository(mxc: Mxc, project: Path, outside: Path) -> None:
    (project / "leak.cue").symlink_to(outside)
    result = mxc("check", str(project / "leak.cue"), "--json")
    data = json.loads(result.stdout)
    assert any("outside the spec's repository" in f["message"] for f in data["findings"]), data
    assert SECRET not in result.stdout + result.stderr


def test_diff_input_gets_the_same_treatment(mxc: Mxc, mxc_home: Path, project: Path) -> None:
    bad = project / "bad.yaml"
    bad.write_text("extends: tiny.yaml\ndescription: !!python/name:os.system x\n")
    assert_refused(mxc("diff", str(project / "tiny.yaml"), str(bad)), r"bad\.yaml:2:\d+: YAML: tags such as")


# ---- 5. control characters never reach the terminal or a CI log raw ------------------------------

FORGED = 'extends: tiny.yaml\n"foo\\nspec.yaml:1: forged\\e[31m": 1\n'


def test_error_lines_cannot_be_forged_by_a_key(mxc: Mxc, project: Path) -> None:
    spec = project / "spec.yaml"
    spec.write_text(FORGED)
    result = mxc("build", str(spec))
    assert_refused(result, r"spec\.yaml:2: a key with control character U\+000A: 'foo\\nspec\.yaml:1: forged\\x1b\[31m'")
    assert len(result.stderr.splitlines()) == 2 and "\x1b" not in result.stderr
    github = mxc("check", str(spec), "--format", "github").stdout
    assert len(github.splitlines()) == 1 and "\x1b" not in github and github.startswith("::error ")
    junit = mxc("check", str(spec), "--format", "junit").stdout
    assert ET.fromstring(junit).get("failures") == "1"  # well-formed XML: no raw control characters
    data = json.loads(mxc("check", str(spec), "--json").stdout)
    assert data["findings"][0]["message"].startswith("a key with control character")


def test_a_file_name_with_a_newline_stays_one_line(mxc: Mxc, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "x\nspecs:1: forged.yaml").write_text("schema: mxc/v1\nname: [\n")
    result = mxc("check", str(specs))
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and not any(line.startswith("specs:1: forged") for line in lines), result.stdout
    assert any("x\\nspecs:1: forged.yaml" in line for line in lines)


def test_printable_escapes_every_control_character() -> None:
    from mxc.compiler.errors import SpecError, printable

    assert printable("a\nb\tc\r\x1b[0m\x7f\x85\u2028\u202e\ud800é") == "a\\nb\\tc\\r\\x1b[0m\\x7f\\x85\\u2028\\u202e\\ud800é"
    assert str(SpecError("f\n.yaml", 3, "k\x1b", "m\n", "s\x07")) == "f\\n.yaml:3: k\\x1b: m\\n (s\\x07)"


# ---- 6. mounts and checkpoint paths cannot add an Apptainer bind -------------------------------

@pytest.mark.parametrize("extra, key", [
    ("runtime:\n  mounts: ['/data:/data,/etc']\n", "runtime.mounts.0"),
    ("runtime:\n  mounts: ['/data,/etc:/data']\n", "runtime.mounts.0"),
    ("runtime:\n  mounts: ['/data:/data:rw']\n", "runtime.mounts.0"),
    ("runtime:\n  mounts: ['/data:/da ta']\n", "runtime.mounts.0"),
    ("checkpoint:\n  dir: /ckpt,/etc\n", "checkpoint.dir"),
    ("checkpoint:\n  dir: /ckpt:/etc\n", "checkpoint.dir"),
    ("checkpoint:\n  dir: relative/dir\n", "checkpoint.dir"),
])
def test_a_comma_cannot_sneak_a_bind_mount_in(extra: str, key: str) -> None:
    (error,) = errors_of(tiny_with(extra))
    assert f": {key}: expected " in error and "without ',', ':' or whitespace" in error, error


def test_an_image_ref_cannot_become_an_option_of_apptainer_or_podman() -> None:
    files = {**{f"base/{p.name}": p.read_text() for p in (REPO / "specs" / "base").glob("*.yaml")},
             "70b.yaml": (REPO / "specs" / "70b.yaml").read_text()}
    for ref in ["--bind=/etc:/x.sif", "a b.sif"]:
        (error,) = errors_of({**files, "spec.yaml": f"extends: 70b.yaml\nimage:\n  ref: {json.dumps(ref)}\n"})
        assert "image.ref: expected an image reference or .sif path" in error, error


def test_plain_mounts_and_checkpoint_dirs_still_build() -> None:
    compile_files(tiny_with("runtime:\n  mounts: ['/data:/data', '/models:/models:ro']\ncheckpoint:\n  dir: /shared/ckpt\n"))


# ---- 7. overrides mxc sets itself ---------------------------------------------------------------

@pytest.mark.parametrize("key, instead", [
    ("jax_cache_dir", "MXC_JAX_CACHE"),
    ("enable_checkpointing", "use checkpoint.period"),
    ("checkpoint_period", "use checkpoint.period"),
    ("skip_jax_distributed_system", "resources.nodes"),
    ("base_output_directory", "use checkpoint.dir"),
    ("run_name", "run id"),
])
def test_overrides_mxc_sets_itself_are_refused_naming_the_field(key: str, instead: str) -> None:
    (error,) = errors_of(tiny_with(f"model:\n  overrides:\n    {key}: x\n"))
    assert f"model.overrides: '{key}' is set by mxc for every run" in error and instead in error, error


def test_hardware_and_autocheckpoint_are_left_to_the_spec() -> None:
    bundle = compile_files(tiny_with("model:\n  overrides:\n    hardware: gpu_multiprocess\n    enable_autocheckpoint: false\n"))
    train = json.loads(bundle.files["run.json"])["train"]  # type: ignore[attr-defined]
    assert "hardware=gpu_multiprocess" in train["args"] and "enable_autocheckpoint=false" in train["args"]
    assert train["distributed_args"] == ["skip_jax_distributed_system=false"]  # neither hardware=gpu nor autocheckpoint


# ---- 8. mxc check agrees with mxc build ---------------------------------------------------------

def test_check_reports_every_refusal_as_an_error(mxc: Mxc, project: Path) -> None:
    attacks = {
        "env.yaml": "extends: tiny.yaml\nenv:\n  vars:\n    LD_PRELOAD: /tmp/x.so\n",
        "mount.yaml": "extends: tiny.yaml\nruntime:\n  mounts: ['/a:/a,/etc']\n",
        "override.yaml": "extends: tiny.yaml\nmodel:\n  overrides:\n    jax_cache_dir: /tmp\n",
        "tag.yaml": "extends: tiny.yaml\ndescription: !x y\n",
        "deep.yaml": f"extends: tiny.yaml\ndescription: {DEEP}\n",
        "bigint.yaml": "extends: tiny.yaml\nrestart: {max: " + "9" * 5000 + "}\n",
        "nul.yaml": "extends: tiny.yaml\ndescription: \"\\0\"\n",
    }
    for name, text in attacks.items():
        (project / name).write_text(text)
    result = mxc("check", str(project), "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    data = json.loads(result.stdout)
    failed = {Path(t["file"]).name for t in data["targets"] if any(f["severity"] == "error" for f in t["findings"])}
    assert failed == set(attacks), data["targets"]


def test_a_hostile_lockfile_is_one_line_not_a_crash() -> None:
    """`mxc build --locked` reads lockfiles/<spec>.lock.json, which arrives through review like a spec."""
    from mxc.compiler.lockfile import parse_lock

    for text, words in [('{"format": ' + "9" * 5000 + "}", "an integer with more than 20 digits"),
                        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 20 levels"),
                        ('{"format": "mxc-lock/v1",', "not valid JSON")]:
        with pytest.raises(SpecErrors) as info:
            parse_lock("lockfiles/x.lock.json", text)
        assert words in str(info.value) and "rewrite it with mxc lock" in str(info.value)
