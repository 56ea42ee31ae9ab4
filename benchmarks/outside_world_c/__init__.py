"""outside_world_c: an independent synthetic TpuGraphs-format world (programs + TPU cost model)."""
GENERATOR = "outside_world_c"
VERSION = 1
