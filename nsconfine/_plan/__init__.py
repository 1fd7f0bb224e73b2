"""The plan: the model, the system entries, deny set, protected paths, profiles, network
and the bwrap arguments. Builds data; runs nothing."""
