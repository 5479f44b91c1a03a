"""The model and its feeds: loading and checking, external data, sizes, sample models, and
the rewritten graphs the judgment runs (severed, reordered)."""
