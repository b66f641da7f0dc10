"""Predicting cells before they run: the cost model and its fit, this machine's forecast, the
time budget, the memory model, shards. May import core, workload, measure (never what runs a cell)."""
