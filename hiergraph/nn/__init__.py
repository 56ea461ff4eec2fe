"""Neural network modules."""
