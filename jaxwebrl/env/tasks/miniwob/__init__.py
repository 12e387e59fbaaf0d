"""The MiniWoB++ family: the bundled task names and splits (`miniwob_tasks.py`, no browser), the env in Chromium
(`miniwob.py`), the scripted oracles (`oracles.py`) and its record (`family.py`)."""
