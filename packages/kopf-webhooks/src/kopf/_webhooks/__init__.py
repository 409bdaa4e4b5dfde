"""Admission webhook servers and tunnels."""
