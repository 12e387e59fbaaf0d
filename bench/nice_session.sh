# Sourced by long background jobs (bench/paper_regime.sh): `source bench/nice_session.sh NICE`.
# `nice` ranks processes inside one scheduling group only. Under the kernel's autogroups (a group a session), a job
# started with setsid takes its group's fair share of the CPU beside other sessions' work, however niced its
# processes are. So when this shell leads its own session, its group is niced to NICE as well; inside another
# session (a terminal's) the group is left alone, as is a kernel without autogroups.
# (/proc/PID/stat's 6th field is the session id: "PID (bash) STATE PPID PGRP SID ...")
if [ -w /proc/self/autogroup ] && [ "$(cut -d' ' -f6 /proc/$$/stat)" = "$$" ]; then
  echo "${1:-10}" > /proc/self/autogroup
fi
