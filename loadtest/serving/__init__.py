"""Serving benchmark: our TorchServe deployment against the naive one-process server."""
