"""mxc: reproducible MaxText training runs, compiled from reviewed specs."""

__version__ = "0.1.0"
