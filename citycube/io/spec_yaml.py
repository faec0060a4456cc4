"""YAML of the declarative specs, read with libyaml's C parser where PyYAML was built with it."""

from __future__ import annotations

from typing import Any

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""The safe loader (no arbitrary objects), in C when available."""


def load_yaml(text: str) -> Any:
    """What ``yaml.safe_load`` returns, parsed about ten times faster: every process that loads
    the definitions (each run, the code server, the daemon) parses the specs."""
    return yaml.load(text, Loader=SAFE_LOADER)
