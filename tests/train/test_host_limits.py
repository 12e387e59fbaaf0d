"""The start-up line about the kernel's memory-map limit: said with its fix when the limit is low, silent when it is
enough or unreadable, and logged by a run's start-up."""

import logging

from configs.constT10 import get_config
from jaxwebrl.train import supervisor
from jaxwebrl.train.host_limits import ENOUGH_MAPS, map_limit_warning


def test_a_low_map_limit_is_one_line_naming_the_sysctl_and_an_enough_or_unreadable_one_is_silent(tmp_path):
    limit = tmp_path / "max_map_count"
    limit.write_text("65530\n")
    line = map_limit_warning(str(limit))
    assert line.startswith("vm.max_map_count is 65530:") and "\n" not in line
    assert line.endswith(f"sudo sysctl -w vm.max_map_count={ENOUGH_MAPS}")
    limit.write_text(f"{ENOUGH_MAPS}\n")
    assert map_limit_warning(str(limit)) is None
    assert map_limit_warning(str(tmp_path / "absent")) is None
    limit.write_text("not a number")
    assert map_limit_warning(str(limit)) is None


def test_the_supervisor_logs_it_at_start_up(tmp_path, monkeypatch, caplog):
    """The run's start-up says it, once the config is validated (the run itself replaced by a no-op; the package
    logger left as the suite found it)."""
    monkeypatch.setattr(supervisor, "map_limit_warning", lambda: "vm.max_map_count is 1: raise it")
    monkeypatch.setattr(supervisor, "_run", lambda *args, **kw: 0)
    monkeypatch.setattr(supervisor.console, "log_to_stderr", lambda: None)
    monkeypatch.setattr(logging.getLogger("jaxwebrl"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="jaxwebrl"):
        assert supervisor.run(get_config("toy"), str(tmp_path / "run")) == 0
    assert "vm.max_map_count is 1: raise it" in caplog.text
