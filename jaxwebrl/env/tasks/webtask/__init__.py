"""The JSON web-task family: specs validated before any browser starts (`task_spec.py`), their env in Chromium
(`webtask.py`) and the family's record (`family.py`)."""
