"""The toy family: a browser-free task of three button presses (`toy.py`), its record (`family.py`)."""
