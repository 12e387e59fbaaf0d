"""bench/ scripts import each other by module name (they run as `python bench/x.py`): put bench/ on sys.path."""

import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
