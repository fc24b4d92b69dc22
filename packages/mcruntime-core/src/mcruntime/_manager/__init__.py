"""The manager and what runs beside it: serving, metrics, settings, logging, the builder."""
