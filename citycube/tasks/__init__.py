"""Benchmark tasks on the cube: translation pairs, splits, sampled instances and metrics, and
forecasting cases with their scores.
"""
