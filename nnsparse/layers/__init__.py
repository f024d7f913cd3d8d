"""Sparse-input layers."""
__all__: list = []
