"""The bundled offline sites: three small websites under `pages/` and 63 tasks on them in WebGym's own format
(`tasks.jsonl`), generated from a seed (`generate.py`), named in `env.tasks` as "sites" (`family.py`)."""
