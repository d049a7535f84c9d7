"""A small translation web page in front of TorchServe (``hymt web``)."""
