"""Model kinds as objects: one class per kind behind `Kind` (kind.py), chosen in `choice.py` alone."""
