"""What a reconciler receives and returns, and which reconcile is in progress: shared by every layer above."""
