"""The invariant families; importing a module registers its invariants in `spec.catalogue`."""
