"""Evidence and reports: frontier, suites, benchmark, replication, pool report, value, publishing."""
