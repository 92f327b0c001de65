"""Analyzers: facts + policy -> findings. They never read files or print."""
