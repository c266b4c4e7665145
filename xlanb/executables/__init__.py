"""Making executables: the one build chain, the loaded set, single ops, background compiles, a graph's stages, TPU targets, prefix graphs."""
