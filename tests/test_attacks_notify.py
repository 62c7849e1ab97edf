"""Webhook answers and destinations (issue 25).

On c388a5b the text of a webhook's error answer reached the terminal of `mxc notify test` (and
notify.log) with its escape sequences (a server could clear the screen, rewrite the title or forge
the lines around it), and the operator's allow-list accepted ``<base>/..;/x``, which Tomcat and Jetty
resolve to ``<base>/../x``: outside the base, while the text still starts with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from mxc.node import notify_policy
from tests.check_support import CPU_SPEC, spec
from tests.conftest import Mxc
from tests.webhook_server import Hook, serve

HOOK_KEY = "zyxwvutsrqponmlkjihgfedcba"
ANSI = b"\x1b]0;pwned\x07\x1b[2J\x1b[1A\r\x1b[Kmxc: test alert sent (200)\xe2\x80\xae"


@pytest.fixture
def hook() -> Iterator[Hook]:
    with serve() as state:
        yield state


def test_escape_sequences_in_a_webhook_answer_never_reach_the_terminal(hook: Hook, tmp_path: Path, mxc: Mxc) -> None:
    hook.status, hook.reply = 403, ANSI
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec(CPU_SPEC, notify={"format": "mattermost", "secret_env": "CHAT_HOOK"})))
    for extra in ((), ("--json",)):
        out = mxc("notify", "test", "--spec", str(spec_path), *extra,
                  env={"CHAT_HOOK": hook.url(f"/hooks/{HOOK_KEY}"), **hook.allow()})
        assert out.returncode == 1, out.stderr
        shown = out.stdout + out.stderr
        assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown and "\u202e" not in shown, repr(shown)
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in shown.replace("\\\\", "\\"), shown


@pytest.mark.parametrize("tail", ["/..;/admin/hooks/x", "/..;jsessionid=1/other", "/%2e%2e;/other", "/..%3b/other",
                                  "/.;/x", "/..%3Bx=1/other", "/%252e%252e%253b/other", "/..%00/other"])
def test_path_parameters_do_not_hide_a_dot_segment(tail: str) -> None:
    base = "https://proxy.example.com/team-a"
    assert notify_policy.destination_problem("telegram", base + tail, base) is not None
    assert notify_policy.api_url_problem(base + tail, base) is not None
    assert notify_policy.destination_problem("telegram", base + "/bot123/sendMessage", base) is None
    assert notify_policy.destination_problem("mattermost", "https://chat.example.com/..;/hooks/" + "a" * 26, None)
