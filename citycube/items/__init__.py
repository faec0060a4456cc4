"""Fetched source items: the protocol adapters implement, installing items atomically, and opening
them as masked rasters.
"""
