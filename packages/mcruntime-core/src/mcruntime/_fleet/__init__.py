"""Clusters and providers: one cluster's lifetime, the ClusterSet lifecycle engine, reconcile requests."""
