"""Stand-in for GroqFlow 4.3.1 (tests only)."""

from groqflow.justgroqit.groqit import groqit  # noqa: F401
