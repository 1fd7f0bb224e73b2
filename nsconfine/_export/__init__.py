"""A plan for another runtime: the OCI bundle (runc, podman, Kubernetes)."""
