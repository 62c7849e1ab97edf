"""Pinning a spec's environment: registry digests, git commits, hashed requirements, lockfiles."""
