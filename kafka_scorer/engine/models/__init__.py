"""The engine's own decoder forward for the served decoder families (`decoder.py`), built from a loaded
transformers checkpoint's weights: per-layer ops from `engine/layers/`, the batch's attention metadata
handed down as an argument, and on CUDA each layer's two dense regions compiled once at warm-up."""
