from caches.region import RegionCache


class QuantizedCache(RegionCache):
    """Selective quantization ("Don't Drop It, Compress It"): nothing is dropped; sink and window
    stay in the model dtype and every older token is kept in INT8 (per-token, per-head scales).

    The middle holds up to max_seq_length - sink - window - chunk tokens (so that with the staging
    slots the cache spans max_seq_length); only a stream longer than that
    loses its oldest middle tokens.

    Paper: No Token Left Behind: Reliable KV Cache Compression via Importance-Aware Mixed
    Precision Quantization, https://arxiv.org/abs/2402.18096; implements its premise that
    tokens are kept at low precision instead of dropped; here the tokens outside sink and
    window are the ones kept in INT8.
    """
    description = "keep everything: sink + window in the model dtype, all older tokens in INT8"
    always_int8 = True
    keeps_every_token = True
    exact_bulk = True

    def __init__(self, batch_size, n_kv_heads, head_dim, max_seq_length, dtype, rope, *,
                 sink, window, middle, chunk=32, **kw):
        # "Don't drop it": the middle holds every token the stream can reach.
        middle = max(1, max_seq_length - sink - window - chunk)
        super().__init__(batch_size, n_kv_heads, head_dim, max_seq_length, dtype, rope,
                         sink=sink, window=window, middle=middle, chunk=chunk, **kw)
