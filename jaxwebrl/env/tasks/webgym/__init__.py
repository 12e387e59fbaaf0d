"""The WebGym family: task files in WebGym's own JSONL format (`webgym_tasks.py`, validated before any browser
starts) played in Chromium by the JSON web-task env, and the family's record (`family.py`)."""
