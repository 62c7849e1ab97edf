"""mxc's reader of a bundle's run contract (``run.json``): the node program's dataclasses
(mxc/node/contract.py), validated by pydantic (unknown keys, missing keys and wrong types fail).

Everything the runtime needs to know about a bundle comes from here, typed: no ``spec.get(...,
default)`` that would restate the spec's defaults a second time.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from mxc.errors import UserError
from mxc.node.contract import FILE, FORMAT, RunContract
from mxc.store import StoredBundle

_ADAPTER = TypeAdapter(RunContract)


def parse(text: str) -> RunContract:
    """Raises ValueError (pydantic's ValidationError) when the text is not a valid contract."""
    return _ADAPTER.validate_json(text)


@functools.lru_cache(maxsize=64)
def _cached(path: str, hash_: str) -> RunContract:
    bundle = StoredBundle(hash_, Path(path))
    return parse(bundle.read(FILE))


def load(bundle: StoredBundle) -> RunContract:
    """The bundle's contract, read through the store (only a file its verified manifest lists, with
    the bytes listed); a UserError (one line, exit 2) when it has none or a broken one."""
    if FILE not in bundle.files():
        raise UserError(f"bundle {bundle.hash[:12]} has no {FILE}: it was built by an older mxc",
                        "rebuild it from its spec with `mxc build`")
    try:
        return _cached(str(bundle.path), bundle.hash)
    except (OSError, ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"bundle {bundle.hash[:12]}: {FILE} is not a valid {FORMAT} contract ({first})",
                        f"check it with: mxc verify {bundle.hash[:12]}") from None
