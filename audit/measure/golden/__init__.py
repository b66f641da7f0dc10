"""The float64 golden and what a cell's numbers are judged by: reference (the float64 golden of an
input set), golden_store (goldens kept on disk, within a run and across runs), numerics (errors,
budgets, saturation, FLOPs), lse (splitting the keys, merging (out, lse) pairs, rows without keys)."""
