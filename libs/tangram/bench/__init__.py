"""Benchmarks behind `tangram bench`."""
