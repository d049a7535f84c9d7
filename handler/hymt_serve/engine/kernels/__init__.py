"""Kernels: decode attention, weight-only (int8/int4) and FP8 projections."""
