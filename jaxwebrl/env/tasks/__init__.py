"""jaxwebrl.env.tasks: the tasks behind the Env interface.

  toy              the browser-free toy task
  miniwob_tasks    the bundled MiniWoB++ task names and difficulty splits (no browser needed)
  task_spec        JSON web-task specs, validated before any browser starts
  browser_env      what every browser-backed env shares (owning or borrowing a Browser, restarts, timings)
  miniwob, webtask MiniWoB++ and JSON web tasks in a browser
  oracles          scripted oracle policies for MiniWoB++ tasks
"""
