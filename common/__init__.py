"""Shared by every task: checks, timing, builds, implementation choice, result records."""
