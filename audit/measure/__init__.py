"""Measuring one cell: clocks, memory, numerics, the float64 golden, the machine's ceilings,
environment and NVML energy, the cell's measurement and what cells share. May import core, workload."""
