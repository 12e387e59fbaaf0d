"""The fleet model: its clock, determinism for a seed, and cases with a closed-form answer."""

import dataclasses

import pytest

from jaxwebrl.env.latency import LatencyConfig
from jaxwebrl.plan.engine import Clock
from jaxwebrl.plan.fleet import EpisodeMix, FleetParams, simulate

# Constant everything: every episode runs its horizon, the browser takes B s a step and a reset, the page D s.
H, G, B, D = 4, 3, 0.2, 0.5
CONSTANT_PAGE = LatencyConfig(regime="web", page_delay_median_s=D, page_delay_p95_s=D, page_delay_max_s=2 * D)


def constant(**changes) -> FleetParams:
    base = FleetParams(workers=5, group_size=G, batch=5 * G, eta=2, mode="sync", dynamic_sampling=False,
                       max_batch=8, episodes=EpisodeMix(horizons=(H,), success_p=0.0, failure_fraction=1.0),
                       latency=CONSTANT_PAGE, browser_step_s=B, server_s0=0.0, server_s1=0.0, update_s_per_row=0.01,
                       publish_s=0.3, pools=(("unshared", None),), browser_pool="unshared", server_pool="unshared",
                       trainer_pool="unshared")
    return dataclasses.replace(base, **changes)


def test_processor_sharing_clock():
    clock = Clock({"cpu": 1.0})
    done = {}
    clock.work("cpu", 1.0, 1.0, lambda: done.setdefault("a", clock.now))
    clock.after(0.5, lambda: clock.work("cpu", 1.0, 1.0, lambda: done.setdefault("b", clock.now)))
    clock.run(until=lambda: len(done) == 2)
    # alone until 0.5 s, then both at half speed: a has 0.5 s left (1 s of wall), b finishes its last 0.5 alone
    assert done == pytest.approx({"a": 1.5, "b": 2.0})


def test_the_model_is_deterministic_for_a_seed():
    params = dataclasses.replace(constant(mode="async", dynamic_sampling=True, batch=6),
                                 latency=LatencyConfig(regime="web"), browser_step_sigma=0.3,
                                 episodes=EpisodeMix(horizons=(3, 6), success_p=0.4, success_steps=2.0,
                                                     failure_fraction=0.8),
                                 pools=(("host", 2.0),), browser_pool="host", server_pool="host", trainer_pool="host",
                                 server_s0=0.02, server_s1=0.01)
    first, again, other = simulate(params, 3, updates=12), simulate(params, 3, updates=12), simulate(params, 4, updates=12)
    assert first == again
    assert first != other


def sync_step_s(params: FleetParams, reset_s: float, step_s: float) -> float:
    """One synchronous round: every worker plays one group (G episodes of a reset and H steps) and the trainer waits
    for all of them, trains W·G·H rows and publishes. A group's first reset runs before its first generate asks
    the gate (as the worker does), so it overlaps the previous update: the round pays max(reset, update)."""
    update_s = params.workers * G * H * params.update_s_per_row + params.publish_s
    return max(reset_s, update_s) + G * (reset_s + H * step_s) - reset_s


def test_sync_round_is_the_slowest_group_plus_the_update():
    params = constant()
    result = simulate(params, 0, updates=6)
    assert result["seconds_per_step"] == pytest.approx(sync_step_s(params, B + D, B + D), rel=1e-9)
    update_s = params.workers * G * H * params.update_s_per_row + params.publish_s
    assert result["trainer_idle_fraction"] == pytest.approx(1 - update_s / result["seconds_per_step"], rel=1e-9)
    assert result["staleness"]["max"] == 0 and result["dropped_stale"] == 0
    slow = constant(update_s_per_row=0.1)    # an update longer than a reset: the round waits for it
    assert simulate(slow, 0, updates=6)["seconds_per_step"] == pytest.approx(sync_step_s(slow, B + D, B + D),
                                                                            rel=1e-9)


def test_async_with_a_slow_trainer_is_trainer_bound():
    # η large enough that nothing waiting in the backlog goes stale (with η = 2 the oldest groups are dropped
    # and the trainer waits for fresh ones: the model's async is not trainer-bound then, nor is the real loop)
    params = constant(mode="async", batch=G, update_s_per_row=5.0, publish_s=0.0, eta=50)
    result = simulate(params, 0, updates=8)
    assert result["trajectories_per_hour"] == pytest.approx(3600.0 / (H * params.update_s_per_row), rel=1e-9)
    assert result["trainer_idle_fraction"] == pytest.approx(0.0, abs=1e-9)
    assert result["staleness"]["max"] <= params.eta


def test_async_with_a_fast_trainer_is_browser_bound():
    # (η large again: with η = 2, seven groups finishing together train as seven versions and the later ones are
    # stale by the time they are reached)
    params = constant(mode="async", batch=G, update_s_per_row=1e-6, publish_s=0.0, workers=7, eta=50)
    # the 7 groups of a round arrive together: from the first update of round 1 to the first of round 21 the
    # trainer consumes exactly 20 rounds of 7 groups
    result = simulate(params, 0, updates=7 * 20 + 1)
    episode_s = (H + 1) * (B + D)
    assert result["trajectories_per_hour"] == pytest.approx(params.workers * 3600.0 / episode_s, rel=1e-4)
    assert result["trainer_idle_fraction"] > 0.99


def test_a_pool_with_room_for_everyone_changes_nothing():
    params = constant(latency=LatencyConfig(regime="local"))
    roomy = dataclasses.replace(params, pools=(("cpu", params.workers + params.trainer_cores),), browser_pool="cpu",
                                server_pool="cpu", trainer_pool="cpu")
    expected = sync_step_s(params, B, B)
    assert simulate(params, 0, updates=4)["seconds_per_step"] == pytest.approx(expected, rel=1e-9)
    assert simulate(roomy, 0, updates=4)["seconds_per_step"] == pytest.approx(expected, rel=1e-9)
    crowded = dataclasses.replace(roomy, pools=(("cpu", 1.0),))   # five browsers and a trainer on one core
    assert simulate(crowded, 0, updates=4)["seconds_per_step"] > 2 * expected
