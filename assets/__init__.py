"""Dagster assets: thin wrappers over the pure ``citycube`` core."""
