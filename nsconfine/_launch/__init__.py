"""Running a plan: the sources opened, the sandbox staged and checked, the command handed
off, the handle, and the egress proxy."""
