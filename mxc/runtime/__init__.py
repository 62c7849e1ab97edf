"""Executing bundles: supervisors, backends, records. Side effects live here, not in the compiler."""
