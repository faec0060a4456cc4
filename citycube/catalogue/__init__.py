"""Declarative specs, validated on load: modalities, cities, source products, temporal rules and
the versions results depend on.
"""
