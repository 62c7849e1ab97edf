"""partial.py: what the check still judges in a spec with errors, and that its stand-ins cause none of their own."""

from __future__ import annotations

import typing
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from mxc.compiler.check.partial import STAND_INS, judge_rest, validate_sections
from mxc.compiler.loader import Path, load_yaml
from mxc.compiler.schema import JobSpec
from mxc.compiler.validate import located_errors
from tests.check_support import GPU_SPEC, spec


def _required(model: type[BaseModel], prefix: Path = (), optional_above: bool = False) -> list[tuple[Path, bool]]:
    """Every required field of the schema, and whether a field above it has a default."""
    out: list[tuple[Path, bool]] = []
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        if info.is_required():
            out.append((path, optional_above))
        annotation = info.annotation
        for member in (annotation, *typing.get_args(annotation)):
            inner = [member, *typing.get_args(member)]
            nested = next((m for m in inner if isinstance(m, type) and issubclass(m, BaseModel)), None)
            if nested is not None:
                out += _required(nested, path, optional_above or not info.is_required())
    return out


def test_every_required_field_has_a_stand_in_or_a_default_above_it() -> None:
    """A new required field without either would leave a spec missing it with no rule run at all."""
    missing = [p for p, optional_above in _required(JobSpec) if p not in STAND_INS and not optional_above]
    assert missing == []


@pytest.mark.parametrize("path", sorted(STAND_INS, key=str))
def test_each_stand_in_is_valid_where_it_stands(path: Path) -> None:
    data: dict[str, Any] = spec(GPU_SPEC)
    node = data
    for part in path[:-1]:
        node = node[str(part)]
    node[str(path[-1])] = STAND_INS[path]
    validate_sections(data)  # what the rest is validated as (the cross-section check is apart)


@pytest.mark.parametrize(("changes", "set_aside"), [
    ({"code__repo": "--upload-pack=touch x"}, [("code", "repo")]),  # dropped, code's own check would miss it
    ({"image__digest": "sha256:abc"}, [("image", "digest")]),
    # The opt-in is refused at the variable; without it, the opt-in names an unset one: set aside too.
    ({"env__allow_dangerous": ["NCCL_DEBUG"]}, [("env", "vars", "NCCL_DEBUG"), ("env", "allow_dangerous")]),
])
def test_setting_a_value_aside_reports_nothing_of_its_own(changes: dict[str, Any], set_aside: list[Path]) -> None:
    doc = load_yaml("spec.yaml", yaml.safe_dump(spec(GPU_SPEC, **changes), sort_keys=False))
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(doc.data)
    rest = judge_rest(doc, "spec.yaml", located_errors(doc, info.value, "spec.yaml"))
    assert rest.spec is not None and rest.set_aside == set_aside and rest.errors == []
