"""Who does the work among replicas: leases, leader election, the heartbeat, rendezvous and sharding."""
