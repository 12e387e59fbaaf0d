"""One training run per workdir: a second one is refused with a clear message; a dead run's lock is gone."""

import os
import subprocess
import sys

import pytest

from jaxwebrl.train.workdir import workdir_lock

HOLD = "import sys, time; from jaxwebrl.train.workdir import workdir_lock\n" \
       "with workdir_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)"


def test_second_run_on_a_workdir_is_refused_until_the_first_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=rf"in use by another training run \(pid {holder.pid}\).*--workdir"):
            with workdir_lock(str(tmp_path)):
                pass
    finally:
        holder.kill()
        holder.wait()
    with workdir_lock(str(tmp_path)):   # killed, not released: the kernel dropped the lock
        assert open(os.path.join(tmp_path, "train.lock")).read() == str(os.getpid())
    with workdir_lock(str(tmp_path)):   # released on exit
        pass
