"""Preprocessing throughput: bare spaCy `nlp.pipe` against the full `MgsaProcessor`, on one corpus, in one run.

Both use the same loaded spaCy pipeline (only the components the processor needs) and the same `nlp.pipe` batch size;
the processor adds tokenization, the constituency tree, the granularity levels, Algorithm 1, local phrases and the
subword alignment. The corpus is cut into chunks of `--call-batch-size` sentences; each chunk is run `--repeats`
times alternately (bare, processor, bare, ...) so that load from other processes hits both alike, and the fastest
run of each is kept. Each processor run starts from the learned conversion's memory (the chains and feature scores it
recalls) as a single pass would have it before the chunk, so that a repeat does not recall the chunk's own trees.
Throughput = sentences / summed chunk times, by wall-clock time and by CPU time (all threads of the process and its
ended children; the steadier figure on a shared machine). Bare spaCy parses on one thread; the processor parses in a
forked child process (on a second thread where none can be forked) while its own thread does the rest (see
`SyntaxParser.pipe`), and the fast tokenizer uses a thread pool unless `TOKENIZERS_PARALLELISM=false` (recorded in the
output).

    python scripts/bench_preprocess.py --source /path/to/multi30k/train.en.gz --target /path/to/multi30k/train.de.gz \
        --output benchmarks/preprocess-cpu.json
"""

import argparse
import copy
import json
import multiprocessing
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import spacy
import transformers
from transformers import AutoTokenizer

from mgsa_hf.processing_mgsa import MgsaProcessor, _cyclic_gc_paused
from mgsa_hf.syntax_spacy import word_arrays
from mgsa_hf.tokenization_utils import read_lines, train_joint_tokenizer


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="source side of the corpus, one sentence per line (.gz ok)")
    parser.add_argument("--target", help="target side, used only to train a tokenizer when --tokenizer is not given")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: train a joint 8k tokenizer on 10k lines)")
    parser.add_argument("--limit", type=int, help="use only the first LIMIT sentences")
    parser.add_argument("--parser-batch-size", type=int, default=256, help="nlp.pipe batch size (both runs)")
    parser.add_argument("--call-batch-size", type=int, default=1000, help="sentences per processor call")
    parser.add_argument("--n-process", type=int, default=1, help="nlp.pipe n_process (both runs)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per chunk and side; the fastest counts")
    parser.add_argument("--output", help="write the figures to this json file")
    return parser.parse_args()


def load_tokenizer(args, workdir):
    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    if not args.target:
        raise SystemExit("give --tokenizer, or --target to train one")
    return train_joint_tokenizer(args.source, args.target, workdir, vocab_size=8000, max_sentences=10000)


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
    with _cyclic_gc_paused():
        conversion_seconds, _ = timed(lambda: [conversion.tree(*parse) for parse in parses])
        tokenizer_seconds, _ = timed(
            lambda: processor.tokenizer(texts, return_special_tokens_mask=True, return_offsets_mapping=True)
        )
    return {"tokenizer": round(1000 * tokenizer_seconds / len(texts), 4),
            "learned_conversion": round(1000 * conversion_seconds / len(texts), 4)}


def main():
    args = parse_args()
    texts = list(read_lines(args.source, args.limit))
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = load_tokenizer(args, workdir)
    processor = MgsaProcessor(tokenizer, parser_batch_size=args.parser_batch_size, n_process=args.n_process)
    nlp = processor.parser.nlp
    processor(texts[:100])  # warm-up

    def bare(chunk):
        for _ in nlp.pipe(chunk, batch_size=args.parser_batch_size, n_process=args.n_process):
            pass

    memory = copy.deepcopy(vars(processor.parser.conversion))
    seconds = time_chunks(processor, bare, texts, args.call_batch_size, args.repeats)
    throughput = {
        clock: {name: round(len(texts) / value, 1) for name, value in clock_seconds.items()}
        for clock, clock_seconds in seconds.items()
    }
    result = {
        "corpus": os.path.basename(args.source),
        "sentences": len(texts),
        "repeats_per_chunk": args.repeats,
        **{f"{clock}_sentences_per_second": values for clock, values in throughput.items()},
        **{
            f"{clock}_processor_over_spacy": round(values["mgsa_processor"] / values["spacy_nlp_pipe"], 3)
            for clock, values in throughput.items()
        },
        "wall_ms_per_sentence": {name: round(1000 * value / len(texts), 4) for name, value in seconds["wall"].items()},
        "parts_alone_ms_per_sentence": part_times(processor, texts, memory, args.parser_batch_size),
        "settings": {
            "parser": processor.parser.resolved_name,
            "components": nlp.pipe_names,
            "parser_batch_size": args.parser_batch_size,
            "call_batch_size": args.call_batch_size,
            "n_process": args.n_process,
            "tokenizer": type(tokenizer).__name__,
            "phrase_levels": processor.phrase_levels,
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "unset (threads on)"),
        },
        "environment": {
            "cpu_count": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "spacy": spacy.__version__,
            "transformers": transformers.__version__,
        },
    }
    for clock in throughput:
        for name, value in result[f"{clock}_sentences_per_second"].items():
            print(f"{clock:4s} {name:16s} {value:8.1f} sentences/s")
        print(f"{clock:4s} processor / spaCy: {result[f'{clock}_processor_over_spacy']:.3f}")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(result, file, indent=2)
            file.write("\n")


if __name__ == "__main__":
    main()
