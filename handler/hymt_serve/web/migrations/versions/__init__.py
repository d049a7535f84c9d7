"""One module per schema revision, applied in the order of their down_revision links."""
