"""A standalone reproduction script per finding, and the check that each reproduces it.
May import core, workload, measure, analysis."""
