"""Per run folder of `sdaccel bench` under a directory: latency and the denoise stage (CUDA events), median and
min over the timed runs, and the first/second-run allocator peaks, one line per batch size."""
import glob
import json
import os
import sys

for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "bench-*.json"))):
    for row in json.load(open(path))["rows"]:
        denoise = row["stage_stats"]["denoise"]
        print(f"{path.split(os.sep)[-2]:>10} {row['model']} b{row['batch_size']}: latency {row['latency_median_s'] * 1e3:.1f} "
              f"ms, denoise median {denoise['median'] * 1e3:.2f} min {denoise['min'] * 1e3:.2f} ms, "
              f"memory {row['first_run_memory_MB']:.0f}/{row['second_run_memory_MB']:.0f} MB, "
              f"cold start {row.get('cold_start_s')}, 2nd start {row.get('restart_start_s')}")
