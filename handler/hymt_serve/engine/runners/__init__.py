"""Runners, what the scheduler steps: the fast runner (static KV cache, packed prefill, CUDA
graphs) and transformers' forward for models the fast runner cannot run."""
