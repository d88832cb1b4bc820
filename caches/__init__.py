"""KV caches: the shared interface, and one file per policy, registered by name."""
from caches.base import KVCache
from caches.full import FullCache

# name -> (class, one-line description); generate.py --cache takes its choices from here.
POLICIES = {
    "full": (FullCache, "keep every token (capacity = max_seq_length)"),
}


def make_cache_factory(name: str):
    if name not in POLICIES:
        raise ValueError(f"unknown cache policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name][0]
