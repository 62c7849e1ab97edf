"""`mxc import maxtext-slurm` on a hostile checkout (issue 25): a pull request to a MaxText-Slurm
repository, or a shared copy, controls its file names, its symlinks and its contents.

On c388a5b the importer followed ``configs/<model>.env.sh`` as a symlink to a private file outside the
repository (read without being asked; its lines pasted into the spec and onto stderr), copied a config
that is a private 0600 file as a world-readable 0644 one beside the spec, and wrote ``config_file:``,
``ref:`` and ``digest:`` unescaped, so a config file name (or --image) holding newlines added
``notify``, ``observability.bind: 0.0.0.0`` and ``restart`` sections to a spec that then built.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from mxc.compiler.loader import load_yaml
from mxc.importers import maxtext_slurm as ms
from tests.conftest import Mxc
from tests.test_attacks_input import SECRET, outside

__all__ = ["outside"]  # the fixture, imported for the tests below

FIXTURES = Path(__file__).parent / "fixtures" / "maxtext_slurm"
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A MaxText-Slurm git checkout: train_env.sh and configs/ (llama2-70b), the way a clone has them."""
    repo = tmp_path / "maxtext-slurm"
    (repo / ".git").mkdir(parents=True)
    (repo / "configs").mkdir()
    shutil.copy(FIXTURES / "train_env.sh", repo / "train_env.sh")
    shutil.copy(FIXTURES / "configs" / "llama2-70b.gpu.yml", repo / "configs" / "llama2-70b.gpu.yml")
    return repo


@pytest.fixture
def private(outside: Path) -> Path:
    """A file of the victim's outside the checkout (test_attacks_input's), readable by them alone."""
    outside.chmod(0o600)
    return outside


def run_import(mxc: Mxc, repo: Path, config: str, *extra: str) -> tuple[Path, object]:
    out_dir = repo.parent / "specs"
    spec = out_dir / "imported.yaml"
    result = mxc("import", "maxtext-slurm", str(repo / "configs" / config), "--env", str(repo / "train_env.sh"),
                 "-o", str(spec), "--digest", DIGEST, *extra, cwd=repo.parent)
    return spec, result


def test_a_model_env_symlinked_outside_the_repository_is_refused_unread(mxc: Mxc, checkout: Path,
                                                                        private: Path) -> None:
    (checkout / "configs" / "llama2-70b.env.sh").symlink_to(private)
    spec, out = run_import(mxc, checkout, "llama2-70b.gpu.yml")
    assert out.returncode == 2, out.stderr  # type: ignore[attr-defined]
    assert "llama2-70b.env.sh: outside the spec's repository" in out.stderr  # type: ignore[attr-defined]
    assert SECRET not in out.stderr + out.stdout  # type: ignore[attr-defined]
    assert not spec.parent.exists() or list(spec.parent.iterdir()) == []


def test_the_model_env_beside_the_config_is_read_and_said_so(mxc: Mxc, checkout: Path) -> None:
    (checkout / "configs" / "llama2-70b.env.sh").write_text("export NCCL_DEBUG=WARN\n")
    spec, out = run_import(mxc, checkout, "llama2-70b.gpu.yml")
    assert out.returncode == 0, out.stderr  # type: ignore[attr-defined]
    assert f"mxc: reading {checkout / 'configs' / 'llama2-70b.env.sh'} too" in out.stderr  # type: ignore[attr-defined]
    assert '    "NCCL_DEBUG": "WARN"' in spec.read_text()


def test_a_config_symlinked_outside_the_repository_is_refused(mxc: Mxc, checkout: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "home" / "private.gpu.yml"
    elsewhere.parent.mkdir(exist_ok=True)
    shutil.copy(checkout / "configs" / "llama2-70b.gpu.yml", elsewhere)
    elsewhere.chmod(0o600)
    (checkout / "configs" / "x.gpu.yml").symlink_to(elsewhere)
    spec, out = run_import(mxc, checkout, "x.gpu.yml")
    assert out.returncode == 2 and "x.gpu.yml: outside the spec's repository" in out.stderr, out.stderr  # type: ignore[attr-defined]
    assert not (spec.parent / "x.gpu.yml").exists()


@pytest.mark.parametrize("mode, copied", [(0o600, 0o600), (0o640, 0o640), (0o644, 0o644)])
def test_the_copied_config_is_no_more_readable_than_its_source(mxc: Mxc, checkout: Path, mode: int,
                                                                copied: int) -> None:
    """A private config (here behind a symlink inside the checkout) stays private beside the spec."""
    source = checkout / "private" / "llama2-70b.real.yml"
    source.parent.mkdir()
    shutil.move(checkout / "configs" / "llama2-70b.gpu.yml", source)
    source.chmod(mode)
    (checkout / "configs" / "llama2-70b.gpu.yml").symlink_to(source)
    old = os.umask(0o022)
    try:
        spec, out = run_import(mxc, checkout, "llama2-70b.gpu.yml")
    finally:
        os.umask(old)
    assert out.returncode == 0, out.stderr  # type: ignore[attr-defined]
    assert stat.S_IMODE((spec.parent / "llama2-70b.gpu.yml").stat().st_mode) == copied


def test_a_spec_holding_lines_of_a_private_env_file_is_private(mxc: Mxc, checkout: Path) -> None:
    (checkout / "train_env.sh").chmod(0o600)
    spec, out = run_import(mxc, checkout, "llama2-70b.gpu.yml")
    assert out.returncode == 0, out.stderr  # type: ignore[attr-defined]
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600


INJECTION = "\nobservability:\n  bind: 0.0.0.0\nrestart:\n  max: 99\n#"


def test_a_config_name_with_newlines_injects_nothing(mxc: Mxc, checkout: Path) -> None:
    name = f"a.yml{INJECTION}.gpu.yml"
    shutil.copy(checkout / "configs" / "llama2-70b.gpu.yml", checkout / "configs" / name)
    spec, out = run_import(mxc, checkout, name)
    assert out.returncode == 2, out.stderr  # type: ignore[attr-defined]
    assert "becomes model.config_file" in out.stderr and "\n" not in out.stderr.strip()  # type: ignore[attr-defined]
    assert not spec.exists()


def test_an_image_with_newlines_injects_nothing(mxc: Mxc, checkout: Path) -> None:
    spec, out = run_import(mxc, checkout, "llama2-70b.gpu.yml", "--image", f"registry.example/x:1{INJECTION}")
    assert out.returncode == 2, out.stderr  # type: ignore[attr-defined]
    assert "image.ref" in out.stderr and not spec.exists()  # type: ignore[attr-defined]


HOSTILE = ["a\nnotify:\n  format: slack", "x: y", "# not a comment", "'\"", "\u2028z", "\x85n", "\\n", "  lead",
           "trail ", "- item", "{a: b}", "&anchor", "*alias", "!tag", "%x", "@x", "`x`", "true", "null", "1e3", "~",
           "é\U0001F600"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_every_value_written_loads_back_as_itself(hostile: str) -> None:
    """The spec built from hostile names and values, loaded by PyYAML, equals the intended spec."""
    env = ms.EnvImport(vars={"A": hostile, "NCCL_DEBUG": hostile}, xla_flags={"xla_x": hostile},
                       sources=[f"env{hostile}.sh"])
    inputs = ms.SpecInputs(name="n", config_name=f"c{hostile}.yml", config_source=f"/x/c{hostile}.yml",
                           facts=ms.ConfigFacts(model_name=hostile, checkpoint_period=5, nodes=2, keys=3), env=env,
                           image=f"img{hostile}", digest=f"sha256:{hostile}", nodes=2, container="podman")
    import yaml

    loaded = yaml.safe_load(ms.spec_text(inputs))
    assert set(loaded) == {"schema", "name", "description", "image", "code", "model", "env", "resources", "runtime",
                           "checkpoint"}
    assert loaded["image"] == {"ref": f"img{hostile}", "digest": f"sha256:{hostile}"}
    assert loaded["model"] == {"model_name": hostile, "config_file": f"c{hostile}.yml"}
    assert loaded["env"] == {"vars": {"A": hostile, "NCCL_DEBUG": hostile}, "xla_flags": {"xla_x": hostile}}
    assert loaded["description"] == f"MaxText-Slurm configuration c{hostile}.yml"
    assert loaded["runtime"] == {"backend": "slurm", "container": "podman"}
    if "\x85" not in hostile and "\u2028" not in hostile:  # mxc's loader refuses those (docs/spec-reference.md)
        assert load_yaml("s.yaml", ms.spec_text(inputs)).data["model"]["config_file"] == f"c{hostile}.yml"
