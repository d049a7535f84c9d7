"""The engine in a process of its own: one per worker (private) or one per GPU (shared)."""
