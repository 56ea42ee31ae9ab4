"""outside_world_d: an outside author's TPU cost-model relabeller (see README.md)."""
