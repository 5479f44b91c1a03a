"""The process boundary: worker processes, their jobs and results, other interpreters, and
the executor that plans and runs them."""
