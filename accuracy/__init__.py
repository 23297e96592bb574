"""Metrics, input sources, the accuracy runner and CLI, and the report generator.

Sits on top of zyfa, reference and capture's store.
"""
