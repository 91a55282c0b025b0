"""Drafter conversion: Hugging Face EAGLE-3 / EAGLE-3.1 checkpoints to eagle3 GGUF files."""
