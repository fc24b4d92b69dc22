"""Talking to one API server: the transport, its health record and probe, discovery, the typed client."""
