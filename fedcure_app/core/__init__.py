"""Pure FedCure algorithms: numpy/scipy only, no torch, no I/O."""
