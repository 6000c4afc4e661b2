"""The hosts' GPU memory and who gets it: each host's arbiter (admission, eviction, zones,
the yield), what to evict and who holds what, and the host RAM of level-1 sleepers."""
