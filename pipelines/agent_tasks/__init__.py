"""Agent tasks beyond forecasting, each served over MCP by its own module."""
