"""Stand-in for groq-runtime (tests only)."""
