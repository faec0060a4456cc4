"""Source families: one module per provider, all behind ``sources.base.SourceBackend``."""
