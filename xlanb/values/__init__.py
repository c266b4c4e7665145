"""Device values: peeked values, device memory, values made without compiling (fills), and the checks CPU torch makes on values."""
