"""Dagster wiring (Definitions, partitions, resources, schedules) and the command line."""
