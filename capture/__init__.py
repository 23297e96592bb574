"""Capture Q/K/V from real models into HDF5.

Model registry and fetch, text sources, the attention hook, the store.
"""
