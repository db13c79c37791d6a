"""The allocator service: the one place where Tangram decides node, GPUs and MIG placements."""
