"""A real webhook receiver on 127.0.0.1 for the alert tests: records every POST, can fail, stall
(until the test releases it: tests wait on events, not the clock), redirect, or echo the request
path back in every encoding a careless server might use."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mxc.node.notify_policy import ALLOWED_URLS_ENV


def encodings(text: str) -> dict[str, str]:
    """``text`` as a server might echo it: raw, URL-quoted (both cases, plus, twice), JSON- and
    HTML-escaped, base64 (standard, URL-safe, inside a longer string), hex."""
    data = text.encode()
    return {
        "raw": text,
        "quote": urllib.parse.quote(text, safe=""),
        "quote-keep-slash": urllib.parse.quote(text),
        "quote_plus": urllib.parse.quote_plus(text),
        "quote-lower": urllib.parse.quote(text, safe="").lower(),
        "quote-twice": urllib.parse.quote(urllib.parse.quote(text, safe=""), safe=""),
        "json": json.dumps(text)[1:-1].replace("/", "\\/"),
        "json-unicode": "".join(f"\\u{ord(c):04x}" for c in text),
        "html": text.replace("&", "&amp;").replace(":", "&#58;"),
        "base64": base64.b64encode(data).decode(),
        "base64-url": base64.urlsafe_b64encode(data).decode().rstrip("="),
        "base64-shifted": base64.b64encode(b"path=" + data).decode(),
        "base64-shifted2": base64.b64encode(b"p=" + data + b"!").decode(),
        "hex": data.hex(),
        "HEX": data.hex().upper(),
    }


def echo_of(path: str, form: str = "all") -> str:
    """The request path in one encoding (``form``), or in all of them."""
    forms = encodings(path)
    return " | ".join(f"{name}: {text}" for name, text in forms.items()) if form == "all" else forms[form]


@dataclass
class Hook:
    """The receiver's state: ``status``/``reply``/``echo``/``redirect`` shape the answer; ``hold``
    keeps every request waiting until the test sets it."""

    port: int
    posts: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    reply: bytes = b"ok"
    echo: str | None = None  # an encoding name of encodings(), or "all": the reply names the request path so
    echo_in_reason: bool = False  # ... and in the HTTP reason phrase
    redirect: str | None = None
    hold: threading.Event | None = None
    arrived: threading.Event = field(default_factory=threading.Event)  # a request was read
    answered: threading.Event = field(default_factory=threading.Event)  # ... and answered

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def allow(self) -> dict[str, str]:
        """The operator setting that lets alerts reach this server (never in a spec)."""
        return {ALLOWED_URLS_ENV: self.base}

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(p["body"]) for p in self.posts]


@contextmanager
def serve() -> Iterator[Hook]:
    state = Hook(port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._answer()

        def do_GET(self) -> None:
            self._answer()

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length).decode()
            state.posts.append({"method": self.command, "path": self.path, "body": body,
                                "type": self.headers.get("Content-Type")})
            state.arrived.set()
            if state.hold is not None:
                state.hold.wait()
            if state.redirect:
                self.send_response(307)
                self.send_header("Location", state.redirect)
                self.end_headers()
                state.answered.set()
                return
            echo = echo_of(self.path, state.echo) if state.echo else ""
            self.send_response(state.status, f"Bad {echo}" if state.echo_in_reason else None)
            self.end_headers()
            # The Telegram shape of a refusal, so the echo is also a Telegram "description".
            self.wfile.write(json.dumps({"ok": False, "description": f"unknown path {echo}"}).encode() if echo
                             else state.reply)
            state.answered.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # a free port, picked by the kernel
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hold is not None:
            state.hold.set()
        server.shutdown()
        server.server_close()
