"""Serve Tencent's Hunyuan-MT translation models with TorchServe.

Modules: ``languages``, ``prompts``, ``protocol`` (request API), ``settings``, ``errors``,
``batching``, ``streaming`` and ``service`` are pure Python; ``engine`` (loading, transformers
``generate``), ``fast_*`` (the fast engine) and ``continuous`` (async-mode schedulers) use torch;
``engine_process`` runs the engine in a child process for async mode;
``hunyuan_mt_handler`` (beside this package) is TorchServe's entry point.
"""

__version__ = "0.1.0"
