"""Kernel packs: checksummed files of validated kernels, applied to unmodified models behind exact guards."""
