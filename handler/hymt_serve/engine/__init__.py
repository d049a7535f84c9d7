"""The model side. A row goes in through ``Engine.submit(row, on_tokens) -> future``
(:mod:`.engine`); one scheduler (:mod:`.scheduler`) admits, steps and finishes rows over a
runner (:mod:`.runners`): the fast runner over a model architecture (:mod:`.models`) and its
kernels (:mod:`.kernels`), or transformers' forward. :mod:`.checkpoints` loads model folders;
:mod:`.process` runs the engine in a child process for TorchServe's async mode."""
