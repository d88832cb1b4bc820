"""Evaluation: streaming perplexity, passkey retrieval, RULER-style tasks, attention loss, sweeps and plots."""
