"""Tests of the trust boundaries: hostile clients, hostile inputs."""
