"""``mxc check``: judge specs and sweeps of flag combinations before they reach a cluster.

Pure, like the rest of the compiler: catalogs (data shipped with mxc), XLA_FLAGS tokens,
rules over a validated spec, matrix expansion and report formatting. Running the real
parsers (``--probe``) is I/O and lives in mxc.runtime.probe.

The package imports nothing itself: ``mxc build`` runs every rule (build_gate.py) without the
report formats, CUE or the probe. Import from the modules: runner (check_document,
check_matrix, check_valid, Lock), registry (RULES, Rule), findings (Finding).
"""
