"""
The chaos soak: an operator under churn, API faults, kills and restarts, with its invariants checked.

See ``tools/soak/README.md``; run it as ``python -m tools.soak --profile short`` from the
repository root.
"""
