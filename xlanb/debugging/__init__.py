"""Debugging numerics and time: the first non-finite op, op-by-op CPU comparison, the profiler."""
