"""The live demonstrations: python -m lab.demo.permutation, python -m lab.demo.probe, python -m
lab.demo.figures."""
