"""Lampo's quantized weight format (LQ): the layout, the quantizer and the recipes.

`layout.py` is the format's specification in numpy (the GPU kernels read exactly these bytes),
`quantizer.py` turns a matrix into codes and scales, `recipes.py` says which width each tensor
class gets. docs/weight-format.md describes the format for people.
"""
