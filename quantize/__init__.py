"""INT8/INT4 primitives: KV-cache middle-region quantization (kv.py) and weight-only quantization
of the linear layers (weights.py: QuantConfig, quantize_state_dict, the Int8/Int4Linear modules)."""
