"""Controllers: work queues with per-cluster lanes, rate limiters, sources, handlers and predicates."""
