"""MCP servers, scripted agents and scorers of the planning and resource-analysis agent tasks."""
