"""The machine a cell runs on: timing (host and CUDA clocks), cell_timing (how a cell's passes are
timed), memory (a call's peak, the process's), roofline (the measured ceilings), nvml, energy and
energy_window (NVML energy), cell_energy (a cell's energy window), environment, compile_cache
(Inductor's on-disk cache), canary (the machine's speed over a run)."""
