"""The numerics checks a cell runs: registry (each check, what it needs, CHECK_ORDER: the order they
run in), their families (output, gradients, lse: a returned log-sum-exp, record: after timing),
contract (what a call must return, the checks' own calls of the variant), and the checks that call
the variant again: arguments (the argument probes judged), invariance (batch and chunk invariance),
paged (the paged cache's unread slots)."""
