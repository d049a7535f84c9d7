"""Triton kernels run by Triton's interpreter on the CPU, each case in a fresh process (the
interpreter must be chosen before Triton defines the kernels).

Triton 3.5.1's interpreter turns a loaded or passed scalar used as a loop bound into a Python
int with ``int(array)``, which numpy 2 refuses for one-element arrays (a kernel whose loop
bound is a runtime argument then fails in the interpreter only); the preamble patches that
one conversion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HANDLER = Path(__file__).resolve().parents[1] / "handler"

PREAMBLE = """
import json, sys
import triton.runtime.interpreter as interpreter

_patch = interpreter._patch_lang_tensor

def _patched(tensor):
    _patch(tensor)
    tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

interpreter._patch_lang_tensor = _patched

import torch
"""


def run_interpreted(body: str, argument: object = None, timeout: float = 300) -> Any:
    """Run ``body`` (after the preamble; ``sys.argv[1]`` is ``argument`` as JSON) under the
    interpreter; returns the JSON of its last line of output."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(HANDLER)}
    done = subprocess.run(
        [sys.executable, "-c", PREAMBLE + body, json.dumps(argument)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
