"""Backends: each declares what it supports; dispatch picks the first that can run."""
