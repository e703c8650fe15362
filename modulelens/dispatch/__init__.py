"""Kernel packs: checksummed files of validated kernels, applied to unmodified models behind guards (the
validated call, or the kernel's checked shape rule; mode and phase), everything else running eager."""
