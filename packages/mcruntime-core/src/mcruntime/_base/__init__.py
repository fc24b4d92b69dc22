"""Foundations every layer uses: errors, the one backoff, supervised tasks, kinds and object helpers."""
