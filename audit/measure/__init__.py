"""Measuring one cell, in rooms (docs/layout.md): cell/ (its phases, what cells share), checks/ (the
numerics checks), golden/ (the float64 golden, numerics), diagnosis/ (the known mistake a wrong result
matches), referee/ (does a call do the work), machine/ (clocks, memory, ceilings, energy, environment);
model_audit and seed at the top. May import core, workload."""
