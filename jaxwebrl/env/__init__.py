"""jaxwebrl.env: what the agent acts in, and the language it acts with, in three subpackages by job.

  base           the Env interface (Observation, StepResult) and its failures (EnvFailure, BrowserCrashed, EnvTimeout)
  registry       env specs: `make_env`, `check_env_spec`, `register_env`, a run config's task list
  latency        the "web" latency regime (a page delay per call, Chromium's network conditions)
  check          `python -m jaxwebrl.env.check`: the browser doctor
  agent/         what the agent reads and writes: the action language, the action grammar, prompt and memory
  browser/       one sandboxed headless Chromium and its security: launch, DevTools I/O, allowlists, egress proxy
  tasks/         the tasks: the toy, MiniWoB++ and JSON web tasks, their specs, scripted oracles

Import direction inside env/ (tests/test_layout.py): agent imports neither browser nor tasks; browser may use agent
(it carries out an Action) but not tasks; tasks may use both. The top-level modules are the interface (base) and
the places that compose the three (registry, check).
"""
