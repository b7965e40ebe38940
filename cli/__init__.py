"""`router-lite`, the command line: above the Dagster code location (assets/), which it builds and materialises.

main.py parses the commands, run.py materialises the lineage stage by stage, summary.py prints what the run wrote."""
