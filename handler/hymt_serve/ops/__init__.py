"""Operations: the ``hymt`` command line, starting and stopping TorchServe, scaling and
health checks, the model archive, and the built-in tiny demo model."""
