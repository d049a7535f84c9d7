"""Serve Tencent's Hunyuan-MT translation models with TorchServe.

- :mod:`.core`: settings, shared types and domain errors; pure Python, imports no other part.
- :mod:`.request`: bodies become requests, prompts and engine rows, results become replies, and
  errors become HTTP statuses (:mod:`.request.errors`); pure Python, imports only core.
- :mod:`.engine`: ``Engine.submit`` -> scheduler -> runner over a model and its kernels, the
  checkpoint loaders and the engine process; imports only core.
- :mod:`.web`: the front end (the page, LibreTranslate, DeepL and KServe v2 APIs).
- :mod:`.ops`: starting, scaling and checking TorchServe, the archive, the demo model.
- :mod:`.cli`: the ``hymt`` command, above all of them.

``hunyuan_mt_handler`` (beside this package) is TorchServe's entry point: it hands bodies to the
request side and rows to the engine. ``tests/unit/test_layers.py`` keeps these layers true.
"""

__version__ = "0.1.0"
