from caches.region import RegionCache


class StreamingCache(RegionCache):
    """StreamingLLM (Xiao et al., 2023): attention sinks + a sliding window.

    The middle has no share: the token leaving the window is evicted at once. State: the region
    buffers only, no statistics.

    Paper: Efficient Streaming Language Models with Attention Sinks,
    https://arxiv.org/abs/2309.17453; implements Section 3.2, the rolling KV cache with
    attention sinks; rank positions are its position shift within the cache.
    """
    has_middle = False
    exact_bulk = True
    description = "attention sinks + sliding window; the token leaving the window is dropped"
