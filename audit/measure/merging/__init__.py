"""Auditing functions that merge partial attention: the partial states (states) and the judge (judge)."""
