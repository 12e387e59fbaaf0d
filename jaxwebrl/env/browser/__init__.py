"""jaxwebrl.env.browser: one sandboxed headless Chromium and its security (no task logic).

  browser          Browser, composed of the modules below
  chromium         launch under chromedriver + the OS sandbox, dies with its owner
  devtools         DevTools I/O (screenshots, input), every call guarded; keys: key names -> CDP key events
  navigation       the allowlist and popup policy of a page; browser_actions: an Action -> browser calls
  allowlist        URL patterns a task may reach; request_guard: every request checked; egress_proxy: every TCP
                   connection checked
  probes           loopback servers that watch what leaves a browser (the doctor's allowlist check, tests)
"""
