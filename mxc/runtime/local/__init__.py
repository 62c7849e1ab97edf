"""Running on this machine: the supervisor (restarts), its launcher and progress."""
