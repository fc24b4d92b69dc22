"""The manager and what runs beside it: serving, metrics, settings, leader election, leases, sharding."""
