"""Rating data: readers, splits, normalisation, synthetic data."""
__all__: list = []
