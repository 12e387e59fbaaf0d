"""jaxwebrl.env.agent: what the agent reads and writes (no browser, no task).

  actions        Action, `parse_action` (model text -> Action), `format_action`: the action language
  action_space   the action grammar a constrained policy may emit (texts per env), and the response prefix
  prompt         the agent's prompt: goal, older steps as text, a window of screenshots by reference
  memory         the agent's Memory JSON: parsed from each response, carried forward, measured

The grammar's token automaton (grammar joined with a tokenizer) is `jaxwebrl.rollout.action_grammar`.
"""
