"""jaxwebrl.env: what the agent acts in, and the language it acts with.

  base           the Env interface (Observation, StepResult) and its failures (EnvFailure, BrowserCrashed, EnvTimeout)
  registry       env specs: `make_env`, `check_env_spec`, `register_env`, a run config's task list
  action_space   the action grammar a constrained policy may emit (texts per env), and the response prefix
  actions        Action, `parse_action` (model text -> Action), `format_action`
  prompt, memory the agent's prompt (goal, memory, window of screenshots by reference) and its memory
  toy            the browser-free toy task
  miniwob_tasks  the bundled MiniWoB++ task names and difficulty splits (no browser needed)
  miniwob, webtask, task_spec, oracles   MiniWoB++ and JSON web tasks in a browser; scripted oracles
  browser        Browser: one sandboxed headless Chromium, composed of
                 chromium (launch + OS sandbox), devtools (DevTools I/O), navigation (allowlist/popup policy),
                 browser_actions (an Action -> browser calls); allowlist, request_guard, egress_proxy, keys
  check          `python -m jaxwebrl.env.check`: the browser doctor
"""
