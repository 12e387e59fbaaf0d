"""The chain family's record: specs "chain/<split>[-<variant>][?trap=N&horizon=N&layout=fixed]", each with its own
horizon, played on the default click grid by an oracle that reads only the screenshots."""

from __future__ import annotations

from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.chain.chain_tasks import PREFIX, chain_names, parse_chain_spec


def _claims(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _check(spec: str) -> str:
    parse_chain_spec(spec)
    return spec


def _make(spec: str, *, network=None, max_steps=None, **options):
    del network, max_steps   # a chain page plays its own horizon; its pages are local (no network emulation)
    from jaxwebrl.env.tasks.chain.chain import ChainEnv  # deferred (heavy): the browser env imports Selenium
    from jaxwebrl.env.tasks.chain.chain_tasks import chain_options

    name, _, query = spec.partition("?")
    return ChainEnv(name, **options, **chain_options(query, name))


def _oracle(spec: str):
    from jaxwebrl.env.tasks.chain.oracle import chain_oracle  # deferred: numpy pixel reading, only when played

    return lambda env, observation, step: chain_oracle(env)


CHAIN = register_family(TaskFamily(
    name="chain", claims=_claims, check=_check, make=_make, horizon=lambda spec, cap: parse_chain_spec(spec).horizon,
    oracle=_oracle, doctor_specs=chain_names))
