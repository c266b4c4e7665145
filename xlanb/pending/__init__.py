"""Pending work: what is live, and computing it (sync, materialize, peek)."""
