#!/usr/bin/env python3
"""The median tokens/s of steps 3-12 (the first two warm up) in each training log given: the
'tokens_per_second' values glmtrain logs every step (bench/gpu_dpo_6b.sh's logs)."""
import re
import statistics
import sys

for f in sys.argv[1:]:
    v = [int(x) for x in re.findall(r"'tokens_per_second': (\d+)", open(f, errors="replace").read())]
    print("%-32s %2d steps, median of steps 3-12: %s" % (f, len(v), statistics.median(v[2:12]) if len(v) >= 12 else "-"))
