"""Loading a model folder: bf16, FP8 and GPTQ-Int4 checkpoints and their tokenizers."""
