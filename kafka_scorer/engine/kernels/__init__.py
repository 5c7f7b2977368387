"""Hand-written kernels, each with a plain torch reference beside it.

Nothing here imports triton at import time: a machine without triton (or without a GPU) still imports
the package and takes the torch paths.
"""
