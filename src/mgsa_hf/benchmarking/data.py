"""The data path at scale, measured on a corpus made from Multi30k: `scripts/bench_data_path.py`.

* [`make_corpus`]: a folder corpus of N pairs, Multi30k train repeated with each copy's lines made distinct (copy k
  starts its sentences with `k`), validation and test as they are.
* [`measure_command`]: wall time, the CPU time of a command's whole process tree, the peak resident memory of each
  of its processes (sampled every 0.2 s with psutil: a peak between samples can be missed) and the peak size of a
  folder it writes.
* [`first_step_command`]: `accelerate launch` with two CPU processes of the training recipe stopped at its first
  step, each process writing its seconds to that step and its peak memory.
"""

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from ..tokenization_utils import read_lines
from ..training.catalogue import accelerate_config_path
from ..training.prepare_command import folder_bytes


def make_corpus(multi30k: Path, folder: Path, pairs: int) -> Path:
    """Write `train.{en,de}.gz` of `pairs` pairs (Multi30k train repeated, copy k's lines starting with `k `) and link
    Multi30k's validation and test files into `folder`; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = list(read_lines(multi30k / f"train.{lang}.gz"))
        with gzip.open(folder / f"train.{lang}.gz", "wt", encoding="utf-8", compresslevel=1) as out:
            for i in range(pairs):
                copy, line = divmod(i, len(lines))
                out.write((f"{copy} {lines[line]}" if copy else lines[line]) + "\n")
        for split in ("val", "test_2016_flickr"):
            target = folder / f"{split}.{lang}.gz"
            if not target.exists():
                target.symlink_to((multi30k / f"{split}.{lang}.gz").resolve())
    return folder


def measure_command(command: list[str], env: dict | None = None, cwd: Path | None = None,
                    watch: Path | None = None) -> dict:
    """Run `command`; its wall seconds, the CPU seconds of its whole process tree (user + system of every process
    it started, workers and their children included, from `getrusage(RUSAGE_CHILDREN)`: exact, as each process is
    reaped by its parent), each process's peak resident memory (MB, sampled every 0.2 s with psutil: a peak between
    samples can be missed), the largest first, and with `watch` the peak bytes of that folder while it ran. Raises
    `RuntimeError` with the end of its output when it fails."""
    import resource
    import tempfile

    import psutil

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    log = tempfile.TemporaryFile(mode="w+")
    started, cpu_before = time.perf_counter(), children_cpu()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(process.pid)
    peaks, disk = {}, 0
    while process.poll() is None:
        for member in [root, *root.children(recursive=True)]:
            try:
                peaks[member.pid] = max(peaks.get(member.pid, 0), member.memory_info().rss)
            except psutil.Error:
                continue
        if watch is not None:
            disk = max(disk, folder_bytes(watch))
        time.sleep(0.2)
    seconds, cpu = time.perf_counter() - started, children_cpu() - cpu_before
    log.seek(0)
    output = log.read()
    log.close()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed: {output[-3000:]}")
    measured = {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                "peak_rss_mb": sorted((round(rss / 2**20) for rss in peaks.values()), reverse=True)[:6],
                "output": output[-2000:]}
    if watch is not None:
        measured["peak_disk_mb"] = round(max(disk, folder_bytes(watch)) / 2**20, 1)
    return measured


def first_step_command(records: Path, recipe: list[str], port: int) -> list[str]:
    """`accelerate launch` (two CPU processes) of the training recipe's first step, each process writing
    `records/rank<N>.json` with its seconds from start to that step and its peak memory."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(accelerate_config_path("cpu_2proc")), "--main_process_port", str(port),
            "-m", "mgsa_hf.benchmarking.data", str(records), *recipe]


def _first_step(records: Path, overrides: list[str]) -> None:
    """Train (see `first_step_command`) until the first optimizer step, then record and stop."""
    import resource

    from accelerate import PartialState
    from transformers import TrainerCallback

    from ..training.config import load_train_config
    from ..training.run import train

    started = time.perf_counter()

    class StopAtFirstStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if "seconds_to_first_step" not in record:
                record["seconds_to_first_step"] = round(time.perf_counter() - started, 1)

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = True

    record = {}
    config = load_train_config(None, overrides)
    train(config, callbacks=[StopAtFirstStep()])
    state = PartialState()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record.update(rank=state.process_index, peak_rss_mb=round(peak))
    records.mkdir(parents=True, exist_ok=True)
    (records / f"rank{state.process_index}.json").write_text(json.dumps(record))
    state.destroy_process_group()


if __name__ == "__main__":
    _first_step(Path(sys.argv[1]), sys.argv[2:])
