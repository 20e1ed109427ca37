"""Typed clients for gpufleet's internal gRPC services (deadline on every call; only
idempotent calls retried). Services talk to each other only through these."""
