"""Draft sources: the EAGLE drafter and the n-gram index of the context (with its index)."""
