"""Exporter plugins shipped with mxc (host, network, gpu, tensorboard); more are found by entry point."""

# What a plugin may be called: a Python identifier, because a name becomes a module name
# (``mxc.plugins.<name>``) or a file name (``<plugins dir>/<name>.py``). Anything else (``../x``,
# ``a.b``, an empty name) could reach outside those places: the spec schema refuses it and
# the exporter reports it as not found. Plain text so the compiler can share it cheaply.
PLUGIN_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
