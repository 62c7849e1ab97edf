"""Entry point: ``python3 -E -s -B <bundle>/mxc_node/__main__.py batch|rank|preflight RESULT``.

Run as a script (the bundle's shims do), it puts the bundle directory on ``sys.path`` in place of
its own directory (whose module names must not shadow the standard library's) and imports the
package by its directory's name. Kept to syntax that any python3 parses, so that an interpreter
older than 3.8 gets a clear message instead of a SyntaxError from the package.
"""

import os
import sys

if sys.version_info < (3, 8):  # noqa: UP036 (the point: an older python3 on a node)
    sys.stderr.write("mxc: the node program needs python3 >= 3.8; this node's is "
                     + sys.version.split()[0] + " (set MXC_NODE_PYTHON)\n")
    sys.exit(2)

if __name__ == "__main__" and not __package__:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(here)
    main = __import__(os.path.basename(here) + ".main", fromlist=["main"]).main
else:
    from .main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
