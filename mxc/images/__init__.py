"""The images/ targets: spython checks, a rootfs from a local Python, Podman/Apptainer builds."""
