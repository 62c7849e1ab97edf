"""Exporter plugins shipped with mxc (host, gpu, tensorboard); more are found by entry point."""
