"""The Slurm backend: submission, Slurm queries, and what a job wrote folded into the record."""
