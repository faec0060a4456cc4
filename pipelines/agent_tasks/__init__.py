"""The agent tasks beyond forecasting, each served over MCP with its own tools and scorer."""
