"""CityCube's pure core: grids, specs, rules, aggregation, chips and cube I/O (no Dagster)."""
