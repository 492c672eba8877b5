"""Compiled inner loops used by the backends, each with a pure-torch fallback."""
