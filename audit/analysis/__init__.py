"""Reading records: findings, the statistics of comparing two runs, pytest-benchmark JSON.
May import core only; never torch."""
