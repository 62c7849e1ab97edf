"""The run's processes as the host sees them: identities that survive pid reuse (``procfs``),
what a run left running (``leftovers``), helpers that die with mxc (``lifetime``) and per-run
temporary directories (``scratch``)."""
