"""The trial's int4 one-row tiles against the dequantized reference, on the GPU (how
check_tiles.txt was made)::

    cd benchmarks/decode/quantized/attention-splits/tiles-trial
    PYTHONPATH=../../../../../handler python check_tiles.py
"""

import torch

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import QUANTIZERS

torch.manual_seed(0)
TILES = [wo.Config(1, 32, 128, 1, 1, 1024), wo.Config(1, 64, 128, 2, 1, 512)]
for cfg in [*TILES, wo.ONE_ROW_CONFIGS[wo.INT4]]:
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
        q, s = QUANTIZERS["int4"](torch.randn(n, k, device="cuda") * 0.02)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        parts = wo.launch(x, q, s, wo.INT4, 128, wo.splits_for(q, cfg), cfg)
        ref = wo.reference(x.float(), q, s)
        err = ((parts.sum(0).float() - ref).norm() / ref.norm()).item()
        verdict = "OK" if err < 1e-2 else "BAD"
        print(tuple(cfg), (n, k), parts.shape[0], f"{err:.2e}", verdict, flush=True)
