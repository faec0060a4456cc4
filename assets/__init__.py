"""Dagster assets: thin wrappers over the pure ``citycube`` core."""

import warnings

import dagster as dg

# Single-run backfill policies are stable in use; Dagster flags the parameter as beta.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
