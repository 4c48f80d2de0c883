"""Cluster orchestration by pull: who initialises, gates, join material, cluster health."""
