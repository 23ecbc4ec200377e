"""Dataset readers and partitioners."""
