"""The Textual terminal chat (``localspec chat``)."""
