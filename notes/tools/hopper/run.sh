#!/bin/bash
# On the GPU machine, from the repository root, after build.sh here (bin/ carried): the probe, the checks of each
# variant under the watchdog build, then the timings; each line as it comes.
cd "$(dirname "$0")/bin"
timeout 30 ./probe
timeout 30 ./probe_pv
for v in 0 1; do timeout 60 ./fa_watch check $v; done
for v in 0 1; do timeout 60 ./fa time $v; done
