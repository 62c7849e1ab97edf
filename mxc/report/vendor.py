"""The plotting library the HTML report inlines: uPlot, vendored byte for byte from its npm package.

Why uPlot: the report is one file that must open with no network, so the library is inlined
into every report; uPlot's minified build is 51 KB (Plotly's smallest bundle and ECharts are
about 1.1 MB each) and it draws tens of thousands of points on a canvas with zoom and a cursor.
``assets/vendor.json`` names the npm package, version and tarball, and the sha256 of each file
taken from it; every report checks them before inlining (and a test checks them too), so a file
edited by accident never reaches a report. To update: ``npm pack uplot@VERSION``, copy
``package/dist/uPlot.iife.min.js``, ``package/dist/uPlot.min.css`` and ``package/LICENSE``
(as ``uPlot.LICENSE``) into assets/, and record the new version and hashes in vendor.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from mxc.errors import UserError

ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass(frozen=True)
class Library:
    name: str
    version: str
    license: str
    homepage: str
    script: str
    style: str
    license_text: str


def read_verified(name: str, sha256: str) -> str:
    """An asset's text, after checking its sha256 against the one recorded when it was vendored."""
    data = (ASSETS / name).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise UserError(f"{ASSETS / name}: sha256 {actual} is not the vendored {sha256}",
                        "the file was changed after it was vendored; reinstall mxc", code=1)
    return data.decode("utf-8")


def manifest() -> dict[str, object]:
    data: dict[str, object] = json.loads((ASSETS / "vendor.json").read_text("utf-8"))
    return data


def uplot() -> Library:
    info = manifest()
    files = info["files"]
    assert isinstance(files, dict)
    text = {role: read_verified(entry["file"], entry["sha256"]) for role, entry in files.items()}
    return Library(name=str(info["package"]), version=str(info["version"]), license=str(info["license"]),
                   homepage=str(info["homepage"]), script=text["script"], style=text["style"],
                   license_text=text["license"])
