"""Tangram's event log as a portable file: export it from JetStream, replay it offline, explain a claim."""
