"""The suite's XLA flags: a learning run's environment drops only the quick-compile flags, whatever else XLA_FLAGS
holds."""

from tests.xla_flags import QUICK_COMPILE, run_speed_env, suite_flags


def test_run_speed_env_keeps_every_flag_but_the_quick_compile_ones(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"{suite_flags(4)} --xla_dump_to=/tmp/x")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    env = run_speed_env()
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=4", "--xla_dump_to=/tmp/x"]
    assert set(QUICK_COMPILE) <= set(suite_flags().split()) and env["JAX_PLATFORMS"] == "cpu"
