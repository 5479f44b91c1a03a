"""The Python API's entry points: `compare()` with typed keywords, and `compare_with_options()`."""
