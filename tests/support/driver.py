"""The DRA driver name Tangram publishes under: a contract with every cluster that runs it, so the
tests write it out rather than read it from the code under test."""

DRIVER = "gpu.tangram.dev"
