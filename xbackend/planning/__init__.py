"""Planning: what a comparison decides before anything runs, read by the probes, the judge and
the orchestration alike: each backend planned (or why it cannot run), the memory plan, the run's
context and a backend's builds as they are read back."""
