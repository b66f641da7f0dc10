"""The numerics checks a cell runs: registry (each check, what it needs, the order they run in), and
the checks that call the variant again: arguments (the argument probes judged), invariance (batch and
chunk invariance), paged (the paged cache's unread slots)."""
