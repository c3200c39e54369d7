"""Cluster: the Ray head and chip-labelled nodes, and the driver that runs a commit on every chip of a cluster."""
