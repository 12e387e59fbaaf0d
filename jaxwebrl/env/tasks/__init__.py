"""jaxwebrl.env.tasks: the tasks behind the Env interface, one folder per task family (`jaxwebrl.env.families`).

  toy/             the browser-free toy task
  miniwob/         the bundled MiniWoB++ tasks (names and splits without a browser), their env, scripted oracles
  chain/           the chain family: rules and instances, its page and env, its screenshot-reading oracle
  webtask/         JSON web-task specs (validated before any browser starts) and their env
  webgym/          task files in WebGym's own JSONL format, played as JSON web tasks answered by the agent
  browser_env      what every browser-backed env shares (owning or borrowing a Browser, restarts, timings)
  episode          an oracle plays one episode (the doctor, tests)

Each family folder has a `family.py` that registers its `TaskFamily` record.
"""
