"""Operator cards: the aten operators a module runs, grouped into runtime-compatible variants."""
