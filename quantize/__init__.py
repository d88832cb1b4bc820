"""INT8/INT4 primitives: KV-cache middle-region quantization (kv.py), weight-only quantization."""
