"""``mxc check``: judge specs and sweeps of flag combinations before they reach a cluster.

Pure, like the rest of the compiler: catalogs (data shipped with mxc), XLA_FLAGS tokens,
rules over a validated spec, matrix expansion and report formatting. Running the real
parsers (``--probe``) is I/O and lives in mxc.runtime.probe.
"""

from mxc.compiler.check.findings import Finding
from mxc.compiler.check.registry import RULES, Rule
from mxc.compiler.check.runner import Checked, Lock, check_combination, check_document, check_matrix, findings_of

__all__ = ["RULES", "Checked", "Finding", "Lock", "Rule", "check_combination", "check_document", "check_matrix",
           "findings_of"]
