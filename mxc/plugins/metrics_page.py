"""Reading another exporter's metrics page on this node: one bounded HTTP GET, never an exception."""

from __future__ import annotations

import http.client

READ_LIMIT = 4 * 1024 * 1024


def fetch(host: str, port: int, timeout: float, limit: int = READ_LIMIT) -> bytes | None:
    """The first ``limit`` bytes of ``http://host:port/metrics``; None when nothing answers with a 200."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/metrics", headers={"Accept": "text/plain"})
        response = connection.getresponse()
        if response.status != 200:
            return None
        return response.read(limit)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
