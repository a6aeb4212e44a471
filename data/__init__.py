"""Datasets: one prepare.py per dataset (python -m data.NAME.prepare), all writing the format read by
data/common.py."""
