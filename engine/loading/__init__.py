"""Loading models: checkpoints, conversion, the embedded default models, tokenizers, files."""
