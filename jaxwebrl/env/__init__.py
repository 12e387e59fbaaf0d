"""jaxwebrl.env: what the agent acts in, and the language it acts with, in three subpackages by job.

  base           the Env interface (Observation, StepResult) and its failures (EnvFailure, BrowserCrashed, EnvTimeout)
  families       the `TaskFamily` record (one per folder of tasks/) and its registry
  registry       env specs composed from the families: `make_env`, `check_env_spec`, `action_texts`, `register_env`
  latency        the "web" latency regime (a page delay per call, Chromium's network conditions)
  check          `python -m jaxwebrl.env.check`: the browser doctor
  agent/         what the agent reads and writes: the action language, the action grammar, prompt and memory
  browser/       one sandboxed headless Chromium and its security: launch, DevTools I/O, allowlists, egress proxy
  tasks/         the tasks: one folder per family (toy, miniwob, chain, webtask), each with its `family.py` record

Import direction inside env/ (tests/test_layout.py): agent imports neither browser nor tasks nor the top-level
modules; browser may use agent (it carries out an Action) but not tasks; tasks may use both. The top-level modules
are the interface (base, families) and the places that compose the three (registry, check).
"""
