"""Open a page in headless Chromium (Debian's ``chromium``, in scripts/setup.sh --test) and keep
what it ended with: the DOM after its scripts ran, and every console message.

``--dump-dom`` prints the DOM once the page has loaded (its scripts run before the load event),
so nothing here waits on a clock. Each call gets its own profile directory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONSOLE = re.compile(r":CONSOLE(?:\(\d+\))?\] (.*)$")


@dataclass(frozen=True)
class Page:
    dom: str
    console: list[str]  # console messages, CSP violations included

    def attribute(self, name: str) -> str | None:
        """An attribute of the <html> element (report.js sets data-mxc-*)."""
        head = self.dom[: self.dom.find(">", self.dom.find("<html")) + 1]
        m = re.search(rf'\s{re.escape(name)}="([^"]*)"', head)
        return m[1] if m else None


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: scripts/setup.sh --test installs it (Debian package chromium)"
    return found


def _base(profile: str) -> list[str]:
    return [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]


def open_page(path: Path, fragment: str = "", size: tuple[int, int] = (1400, 2400)) -> Page:
    url = path.resolve().as_uri() + fragment
    with tempfile.TemporaryDirectory(prefix="mxc-chromium-") as profile:
        out = subprocess.run([*_base(profile), f"--window-size={size[0]},{size[1]}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    console = [m[1] for line in out.stderr.splitlines() if (m := CONSOLE.search(line))]
    return Page(out.stdout, console)


def screenshot(path: Path, png: Path, fragment: str = "", size: tuple[int, int] = (1400, 2400)) -> None:
    with tempfile.TemporaryDirectory(prefix="mxc-chromium-") as profile:
        out = subprocess.run([*_base(profile), f"--window-size={size[0]},{size[1]}", f"--screenshot={png}",
                              path.resolve().as_uri() + fragment], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and png.is_file(), out.stderr[-3000:]
