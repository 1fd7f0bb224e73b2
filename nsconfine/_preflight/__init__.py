"""What the machine can do: bwrap, user namespaces, the kernel's layers, cached."""
