"""The live demonstrations: python -m demo.permutation, python -m demo.probe, python -m demo.figures."""
