"""Files a user points localspec at: discovery of targets and drafters, the Hugging Face hub,
GGUF keys and file information, and the session cache on disk."""
