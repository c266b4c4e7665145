"""Loops the program asks for (scan, scan_layers) and optimization barriers."""
