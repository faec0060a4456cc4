"""Agents on the cube: case-scoped views with hidden years, the forecasting tools, trajectories,
submissions and their scoring (AgenticCity-Bench App. D).

Pure core: no Dagster and no MCP here. The MCP server and the scripted client that drive these
objects live in :mod:`pipelines.agents`.
"""
