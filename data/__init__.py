"""Datasets: one prepare.py per dataset, all writing the format read by data/common.py."""
