"""Serve Tencent's Hunyuan-MT translation models with TorchServe.

Modules: ``languages``, ``prompts``, ``protocol`` (request API), ``settings``, ``errors``,
``batching`` and ``service`` are pure Python; ``engine`` is the only serving module that imports
torch and transformers; ``ts_handler`` (beside this package) is TorchServe's entry point.
"""

__version__ = "0.1.0"
