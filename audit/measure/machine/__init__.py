"""The machine a cell runs on: timing (host and CUDA clocks), memory (a call's peak, the process's),
roofline (the measured ceilings), nvml, energy and energy_window (NVML energy), environment,
compile_cache (Inductor's on-disk cache), canary (the machine's speed over a run)."""
