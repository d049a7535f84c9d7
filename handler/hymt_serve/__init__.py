"""Serve Tencent's Hunyuan-MT translation models with TorchServe.

Where a request goes: ``hunyuan_mt_handler`` (beside this package, TorchServe's entry point)
hands bodies to :mod:`hymt_serve.request` (transport, protocol, prompts, the service: pure
Python), whose texts become rows submitted to :mod:`hymt_serve.engine` (``Engine.submit``: one
scheduler over the fast runner or transformers' forward; in async mode in a child process).
Every failure becomes a :class:`~hymt_serve.request.errors.ServiceError` with its HTTP status.
:mod:`hymt_serve.ops` starts, scales and checks the server; :mod:`hymt_serve.web` is the page.
"""

__version__ = "0.1.0"
