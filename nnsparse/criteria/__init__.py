"""Criteria for sparse targets and denoising autoencoders."""
__all__: list = []
