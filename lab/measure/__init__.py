"""Measuring trained models: loss at every position, passkey retrieval, and the demos' instruments."""
