"""Kernel backends (cpp, cuda, triton), the candidate contract and the template library."""
