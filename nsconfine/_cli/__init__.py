"""The `nsconfine` command: argument parsing and the `run` relay."""
