"""Processes, Redis servers, ports and load for tests and benchmarks alike."""
