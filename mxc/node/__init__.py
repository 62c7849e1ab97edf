"""The node program: what runs on each compute node of a job (and once for a local run), shipped
verbatim in every bundle.

These files are copied as they are into each bundle (``mxc_node/``, covered by its hash) and run
by the host's ``python3 -E -s`` of a compute node, which may be as old as Python 3.8 and has
nothing installed. So every module here:

- uses the standard library only (never mxc, pydantic, ray, jax or any other package);
- is written in Python 3.8 syntax and API (``from __future__ import annotations`` first; no
  ``match``, no ``str.removeprefix``, no ``dict | dict``, no ``functools.cache``...);
- imports its siblings relatively only (``from . import checkpoints``), because the package is
  renamed when it is copied into a bundle.

mxc itself imports the same modules as ``mxc.node`` (the contract, the events, the restart
policy), so the writer and the reader of every file share one definition.
tests/test_node_compat.py enforces these rules on every file of this package, and runs the
self-test (``python3 -m <package>.selftest``) under the system Python, outside any virtualenv.
"""
