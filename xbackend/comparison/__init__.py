"""One model compared across backends: the orchestration layer (see xbackend.comparison.run).

The public entry points are xbackend.compare() and xbackend.compare_with_options()
(xbackend.api.compare), which call this package for the original and for each candidate."""
