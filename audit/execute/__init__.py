"""Running a grid: the runner (cell -> record), supervisor and worker, Ctrl-C, the folder lock,
merging shards, the Ray executor, shrinking findings (with repro's minimal scripts). May import core,
workload, measure, plan, analysis, repro."""
