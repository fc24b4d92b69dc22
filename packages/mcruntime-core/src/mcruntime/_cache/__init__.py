"""Informers and the cache built on them: list, watch, index and read without a round trip."""
