"""The execution modes: recording or running one op, the mode objects, switching."""
