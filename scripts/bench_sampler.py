"""`TokenBatchSampler` at the papers' scale: its build time and one epoch's time (CPU and wall) and memory a row, on a
synthetic length table of WMT14's size (4.5M pairs; source lengths lognormal, clipped to 1..256 subwords; targets a
lognormal ratio of them), for two processes.

    python scripts/bench_sampler.py --rows 4500000 --max-tokens 4096 --output benchmarks/sampler-cpu.json
"""

import argparse
import json
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np

from mgsa_hf.training.trainer import TokenBatchSampler


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_500_000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    source = np.clip(rng.lognormal(3.0, 0.6, args.rows), 1, 256).astype(np.int32)
    target = np.clip(source * rng.lognormal(0.05, 0.15, args.rows), 1, 256).astype(np.int32)

    def build():
        return TokenBatchSampler(source, target, args.max_tokens, seed=1, num_replicas=args.replicas)

    sampler, build_wall, build_cpu = timed(build)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        count, wall, cpu = timed(lambda: sum(len(batch) for batch in sampler))
        epochs.append({"epoch": epoch, "indices": count, "wall_seconds": wall, "cpu_seconds": cpu})
    tracemalloc.start()
    sampler = build()
    kept, build_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    next(iter(sampler))
    during, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    result = {"rows": args.rows, "max_tokens": args.max_tokens, "replicas": args.replicas, "batches": len(sampler),
              "build": {"wall_seconds": build_wall, "cpu_seconds": build_cpu}, "epochs": epochs,
              "bytes_a_row": {"kept": round(kept / args.rows, 1), "peak_building": round(build_peak / args.rows, 1),
                              "during_an_epoch": round(during / args.rows, 1)},
              "machine": {"platform": platform.platform(), "numpy": np.__version__}}
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
