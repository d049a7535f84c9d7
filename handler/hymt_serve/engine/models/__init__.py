"""Model architectures the fast runner can run, one module per architecture."""
