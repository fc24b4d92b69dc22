"""Clusters and providers: one cluster's lifetime, the ClusterSet lifecycle engine, the provider protocols."""
