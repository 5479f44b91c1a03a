"""What rounding allows a node to differ by: per element against float64, composed, and per
op type for a backend that could not be judged."""
