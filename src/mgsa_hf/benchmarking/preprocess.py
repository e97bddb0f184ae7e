"""Preprocessing throughput: the timing of `scripts/bench_preprocess.py` (bare spaCy `nlp.pipe` against the full
`MgsaProcessor` on the same chunks, each run alternately and the fastest kept; the processor's parts timed alone)."""

import copy
import multiprocessing
import os
import resource
import time
from pathlib import Path

from ..processing_mgsa import cyclic_gc_paused
from ..syntax_spacy import word_arrays


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its children, ended or running (the processor's parse
    process: its user and system ticks from /proc)."""
    own, ended = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime
    for child in multiprocessing.active_children():
        fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def timed(function, *args) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    function(*args)
    return time.perf_counter() - wall, cpu_seconds() - cpu


def time_chunks(processor, bare, texts, call_batch_size: int, repeats: int) -> dict[str, dict[str, float]]:
    """Summed fastest chunk times `{clock: {"spacy_nlp_pipe": s, "mgsa_processor": s}}` for the wall and CPU clocks;
    each chunk runs `repeats` times alternately (`bare(chunk)`, then `processor(chunk)`). Every processor repeat
    starts from the learned conversion's memory (the chains and feature scores it recalls) as it was before the
    chunk, so the repeats time what a single pass over the corpus does, and the conversion ends as after one pass."""
    seconds = {clock: {"spacy_nlp_pipe": 0.0, "mgsa_processor": 0.0} for clock in ("wall", "cpu")}
    conversion = processor.parser.conversion  # the process-wide conversion, whose memory the processor fills
    memory_before_chunk = copy.deepcopy(vars(conversion))
    for start in range(0, len(texts), call_batch_size):
        chunk = texts[start : start + call_batch_size]
        best = {clock: {"spacy_nlp_pipe": [], "mgsa_processor": []} for clock in seconds}
        for _ in range(repeats):
            vars(conversion).update(copy.deepcopy(memory_before_chunk))
            for name, function in [("spacy_nlp_pipe", bare), ("mgsa_processor", processor)]:
                for clock, value in zip(("wall", "cpu"), timed(function, chunk), strict=True):
                    best[clock][name].append(value)
        memory_before_chunk = copy.deepcopy(vars(conversion))
        for clock, chunk_runs in best.items():
            for name, values in chunk_runs.items():
                seconds[clock][name] += min(values)
    return seconds


def part_times(processor, texts, memory: dict, parser_batch_size: int) -> dict[str, float]:
    """Milliseconds per sentence (wall) of two parts of the processor timed alone, one pass each, with the cyclic
    garbage collector paused as in the processor: the tokenizer over the corpus, and the learned conversion over the
    corpus's dependency parses from the conversion's `memory` (what it recalled before the timed runs)."""
    nlp, conversion = processor.parser.nlp, processor.parser.conversion
    parses = [word_arrays(doc)[:3] for doc in nlp.pipe(texts, batch_size=parser_batch_size)]
    vars(conversion).update(copy.deepcopy(memory))
    with cyclic_gc_paused():
        conversion_seconds, _ = timed(lambda: [conversion.tree(*parse) for parse in parses])
        tokenizer_seconds, _ = timed(
            lambda: processor.tokenizer(texts, return_special_tokens_mask=True, return_offsets_mapping=True)
        )
    return {"tokenizer": round(1000 * tokenizer_seconds / len(texts), 4),
            "learned_conversion": round(1000 * conversion_seconds / len(texts), 4)}
