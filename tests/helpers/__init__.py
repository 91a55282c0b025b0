"""Shared helpers of the tests: tiny models, references, and what several test files use."""
