"""Run configs: `base.py` (every field, the scales) and one file per recipe, each with `get_config(arg)`.

A package (setup.py installs it), so `python3 launch/train.py --config=configs/constT10.py:toy` finds
`configs.base` from any working directory.
"""
