"""The float64 judgment: each node's output against its own float64 value, and the run that ships
judged in stretches (its modules are imported by their full path)."""
