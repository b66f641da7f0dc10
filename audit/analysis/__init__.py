"""Reading records: findings, the statistics of comparing two runs, pytest-benchmark JSON.
May import core, workload (the known mistakes' explanations, workload.mistakes); never torch."""
