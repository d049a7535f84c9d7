"""The model side. A row goes in through ``Engine.submit(row, on_tokens) -> future``
(:mod:`.engine`); one scheduler (:mod:`.scheduler`) admits, steps and finishes rows over a
runner: the fast engine's (:mod:`.runner`, :mod:`.model`, :mod:`.attention`) or transformers'
forward (:mod:`.hf`). :mod:`.process` runs it in a child process for TorchServe's async mode."""
