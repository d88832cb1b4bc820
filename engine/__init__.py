"""Loading, tokenizers, conversion, generation loop and default-model resolution."""
