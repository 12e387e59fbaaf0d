"""The chain family: rules and instances without a browser (`chain_tasks.py`), its page (`pages/chain.html`), its
env in Chromium (`chain.py`), its oracle (`oracle.py`) and its record (`family.py`)."""
