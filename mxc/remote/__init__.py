"""Remote Slurm from a laptop: cluster profiles, SSH, bundle copies by content, commands run on a login node.

What runs where (docs/remote.md): the laptop compiles and keeps bundles (``mxc build``); a cluster
profile (``profiles.py``, outside specs and bundles) names the login node and the mxc installed
there; ``ssh.py`` reaches it through the user's own ssh (config, agent, keys) with one shared
connection (ControlMaster); ``sync.py`` copies a bundle the remote store lacks as a tar stream,
verified there before it is stored; ``agent.py`` is the login node's side of every call (the same
mxc, hidden command ``mxc remote-agent``): it checks the versions match, sets the remote
``MXC_HOME``/``MXC_RUNS_DIR`` and runs the ordinary command, so the cluster's mxc does everything it
does anyway (sbatch, records, alerts); ``commands.py`` is the CLI (``mxc cluster ...`` and
``--cluster NAME`` on run, runs, logs, wait, cancel, triage, report, metrics, watch).
"""
