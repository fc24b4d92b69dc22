"""Admission and conversion webhooks that know which cluster is calling."""
