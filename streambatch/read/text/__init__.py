"""Text inputs: plain-text files, tokenizers, byte tokens, and text split into bounded documents."""
