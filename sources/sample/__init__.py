"""Deterministic synthetic stand-ins for every source product (the offline default backend).

Everything written here is labelled synthetic: GeoTIFF tags, STAC properties and the
``SourceItem.synthetic`` flag.
"""

from sources.sample.backend import SAMPLE_VERSION, SampleBackend
from sources.sample.world import SYNTHETIC_NOTICE, SyntheticCity, synthetic_city

__all__ = ["SAMPLE_VERSION", "SYNTHETIC_NOTICE", "SampleBackend", "SyntheticCity", "synthetic_city"]
