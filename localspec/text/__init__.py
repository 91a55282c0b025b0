"""Text around the tokens: the chat template, text streamed out of tokens, and fitting a
conversation to the context."""
