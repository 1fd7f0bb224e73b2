"""`nsconfine selftest`: a world of decoys and the probes run against it."""
