"""Isolated worker processes that compile and run candidate kernels.

A candidate that segfaults, hangs, prints, or allocates without bound ends or harms only its
worker; the caller gets a verdict and a fresh worker next time."""
