"""MaxText's pydantic config keys read from its source with ``ast``, without importing MaxText.

Importing ``configs/types.py`` needs jax and half of MaxText's dependencies, in the versions
that MaxText pins; reading it needs neither, so a catalog can be made for a fork or for the
MaxText inside an image from any machine. What is read is what pydantic would collect:

- the annotated fields of ``MaxTextConfig`` and of every base class defined in the same
  module (most-derived definition wins, as in pydantic), without ClassVars and private names;
- each annotation reduced to the catalog's types the same way the import path does
  (tools/gen_maxtext_catalog.py ``describe``): ``None | X``/``Optional`` make a key optional,
  ``Literal`` and ``Enum`` classes give choices (enums imported from another MaxText module
  are read from that module), ``NonNegativeInt``-style pydantic types are their base type.

tests/test_check_field.py proves the result equals the import path on the installed maxtext.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PYDANTIC_NUMBERS = {
    "PositiveInt": "int", "NonNegativeInt": "int", "NegativeInt": "int", "NonPositiveInt": "int", "StrictInt": "int",
    "PositiveFloat": "float", "NonNegativeFloat": "float", "NegativeFloat": "float", "NonPositiveFloat": "float",
    "StrictFloat": "float", "StrictBool": "bool", "StrictStr": "str",
}
BUILTINS = {"bool", "int", "float", "str"}
Reader = Callable[[str], "ast.Module | None"]  # dotted module name -> its parsed source, if in the tree


@dataclass
class Module:
    """What one parsed module defines at top level, for resolving annotations."""

    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)  # X = <type>, type X = <type>
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)

    @classmethod
    def parse(cls, tree: ast.Module) -> Module:
        mod = cls(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                mod.aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.TypeAlias) and isinstance(node.name, ast.Name):
                mod.aliases[node.name.id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (node.module, alias.name)
        return mod


class Extractor:
    """Fields of one pydantic model class, described as the catalog describes them."""

    def __init__(self, module: Module, read_module: Reader) -> None:
        self.module = module
        self.read_module = read_module
        self._modules: dict[str, Module | None] = {}

    def fields(self, class_name: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for cls in reversed(self._mro(class_name)):  # base first, the most-derived definition wins
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    name = node.target.id
                    if name.startswith("_") or name == "model_config" or self._is_classvar(node.annotation):
                        continue
                    out[name] = self.describe(node.annotation, self.module)
        return out

    def model_names(self) -> list[str] | None:
        """The ``ModelName`` Literal, if the module defines one."""
        value = self.module.aliases.get("ModelName")
        if value is None:
            return None
        found = self.describe(value, self.module)
        return list(found.get("choices", [])) or None

    def _mro(self, class_name: str) -> list[ast.ClassDef]:
        order: list[ast.ClassDef] = []

        def visit(name: str) -> None:
            cls = self.module.classes.get(name)
            if cls is None or cls in order:
                return
            order.append(cls)
            for base in cls.bases:
                if isinstance(base, ast.Name):
                    visit(base.id)

        visit(class_name)
        if not order:
            raise KeyError(f"no class {class_name} in the module")
        return order

    @staticmethod
    def _is_classvar(node: ast.expr) -> bool:
        target = node.value if isinstance(node, ast.Subscript) else node
        return (isinstance(target, ast.Name) and target.id == "ClassVar") or (
            isinstance(target, ast.Attribute) and target.attr == "ClassVar")

    # ---------------------------------------------------------------- annotations

    def describe(self, node: ast.expr, module: Module, optional: bool = False, depth: int = 0) -> dict[str, Any]:
        if depth > 20:
            return {"type": "any", "optional": optional}
        if isinstance(node, ast.Constant) and node.value is None:
            return {"type": "any", "optional": True}
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
            try:
                return self.describe(ast.parse(node.value, mode="eval").body, module, optional, depth + 1)
            except SyntaxError:
                return {"type": "any", "optional": optional}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._union(_flatten_union(node), module, optional, depth)
        if isinstance(node, ast.Subscript):
            head = _name(node.value)
            args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Annotated":
                return self.describe(args[0], module, optional, depth + 1)
            if head == "Optional":
                return self.describe(args[0], module, True, depth + 1)
            if head == "Union":
                return self._union(args, module, optional, depth)
            if head == "Literal":
                return {"type": "enum", "optional": optional, "choices": [_literal_text(a) for a in args]}
            if head in ("list", "List"):
                return {"type": "list", "optional": optional}
            if head in ("dict", "Dict"):
                return {"type": "dict", "optional": optional}
            return {"type": "any", "optional": optional}
        name = _name(node)
        if name is None:
            return {"type": "any", "optional": optional}
        if name in BUILTINS:
            return {"type": name, "optional": optional}
        if name in PYDANTIC_NUMBERS:
            return {"type": PYDANTIC_NUMBERS[name], "optional": optional}
        if name in ("list", "List"):
            return {"type": "list", "optional": optional}
        if name in ("dict", "Dict"):
            return {"type": "dict", "optional": optional}
        return self._named(name, module, optional, depth)

    def _union(self, args: list[ast.expr], module: Module, optional: bool, depth: int) -> dict[str, Any]:
        kept = [a for a in args if not (isinstance(a, ast.Constant) and a.value is None) and _name(a) != "None"]
        optional = optional or len(kept) < len(args)
        if len(kept) == 1:
            return self.describe(kept[0], module, optional, depth + 1)
        kinds = {self.describe(a, module, False, depth + 1)["type"] for a in kept}
        return {"type": "number" if kinds <= {"int", "float"} else "any", "optional": optional}

    def _named(self, name: str, module: Module, optional: bool, depth: int) -> dict[str, Any]:
        """A name: an enum class, an alias (``PathStr = str``), or one imported from another module."""
        cls = module.classes.get(name)
        if cls is not None:
            choices = _enum_choices(cls)
            return {"type": "enum", "optional": optional, "choices": choices} if choices is not None else {
                "type": "any", "optional": optional}
        alias = module.aliases.get(name)
        if alias is not None:
            if isinstance(alias, ast.Call):  # NewType("X", str) and friends: opaque to pydantic's describe
                return {"type": "any", "optional": optional}
            return self.describe(alias, module, optional, depth + 1)
        imported = module.imports.get(name)
        if imported is not None:
            other = self._module(imported[0])
            if other is not None:
                return self._named(imported[1], other, optional, depth + 1)
        return {"type": "any", "optional": optional}

    def _module(self, dotted: str) -> Module | None:
        if dotted not in self._modules:
            tree = self.read_module(dotted)
            self._modules[dotted] = Module.parse(tree) if tree is not None else None
        return self._modules[dotted]


def _flatten_union(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _flatten_union(node.left) + _flatten_union(node.right)
    return [node]


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Literal, pydantic.types.PositiveInt
        return node.attr
    return None


def _literal_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return str(-node.operand.value)  # type: ignore[operator]
    return ast.unparse(node)


def _enum_choices(cls: ast.ClassDef) -> list[str] | None:
    """The member values of an Enum subclass (``str(member.value)``), or None if it is no enum."""
    bases = {_name(b) for b in cls.bases}
    if not bases & {"Enum", "IntEnum", "StrEnum"}:
        return None
    values = []
    for node in cls.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id.startswith("_"):
                continue
            if not isinstance(node.value, ast.Constant):
                return None  # auto() or computed values: only importing could tell
            text = str(node.value.value)
            if text not in values:  # a repeated value is an alias, not a member
                values.append(text)
    return values
