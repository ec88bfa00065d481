"""Tools: the beta solver CLI, the paper's benchmark inputs, precision comparison, benchmarks."""
