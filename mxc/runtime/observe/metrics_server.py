"""The exporter's HTTP server: prometheus-client's WSGI app, answering only with the run's scrape token.

Why a token: a job spanning nodes has its exporters listen on each node's cluster address
(not loopback), so the run's Prometheus on node rank 0 reaches them all; anyone else on that
network could then read the run's metrics (loss, step times, host and GPU state, plugin error
texts). Each run has one random token (``scrape_token.py``, a 0600 file in the run directory);
the run's Prometheus sends it (``authorization.credentials_file`` in prometheus.yml) and every
other request gets 401 without a byte of metrics. Without a token (an exporter started by hand,
the benchmarks) it serves everyone, as prometheus-client's own server does.

Built from public pieces only (``make_wsgi_app`` and the standard library's wsgiref with a
thread per request), so a prometheus-client upgrade cannot change it underneath.
"""

from __future__ import annotations

import hmac
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
REFUSED = b"the run's scrape token is required (<run>/prometheus/scrape-token)\n"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse DNS lookup of the address (``getfqdn``), which
        stalls for seconds on a node whose resolver does not answer."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        """One line per scrape on stderr would fill the exporter's log."""


def require_token(app: App, token: str) -> App:
    """``app`` behind ``Authorization: Bearer <token>`` (compared in constant time)."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                ("WWW-Authenticate", 'Bearer realm="mxc exporter"')])
            return [REFUSED]
        return app(environ, start_response)

    return guarded


def start(registry: CollectorRegistry, bind: str, port: int, token: str | None = None) -> WSGIServer:
    """Serve ``registry`` on ``bind:port`` in a daemon thread; ``OSError`` when the port is taken."""
    family, address = _family(bind, port)

    class Server(_Server):
        address_family = family

    app: App = make_wsgi_app(registry)
    if token:
        app = require_token(app, token)
    server = make_server(address, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="mxc-exporter-http", daemon=True).start()
    return server


def _family(address: str, port: int) -> tuple[socket.AddressFamily, str]:
    """IPv4 or IPv6, as the address says (an IPv6 literal cannot be bound on an AF_INET socket)."""
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])
