"""The request side (pure Python, no torch): what TorchServe hands over, the JSON API, languages,
the model families' prompts and request fields, settings, typed errors, and the service that
turns requests into engine rows and results into replies."""
