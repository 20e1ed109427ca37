"""gpufleet.sim: a deterministic fleet simulator over gpufleet's real decisions."""
