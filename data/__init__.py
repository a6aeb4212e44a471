"""Datasets: one prepare.py per dataset (python -m data.NAME.prepare), all writing data/common.py's format."""
