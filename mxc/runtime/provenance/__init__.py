"""What a run ran with: the pinned code export and the host facts recorded for drift checks."""
