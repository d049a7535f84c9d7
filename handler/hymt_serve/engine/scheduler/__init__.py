"""The scheduler: admission, decode steps, sampling and finishing over a runner."""
