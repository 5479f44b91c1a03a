"""Determinism certificates: certify one backend, verify it on another machine."""
