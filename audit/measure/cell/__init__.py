"""One cell's measurement: measurement (its phases), cellcache (inputs, goldens and compiled code
shared by cells), repeats (run-to-run determinism), failures (a failed cell's reason and text)."""
