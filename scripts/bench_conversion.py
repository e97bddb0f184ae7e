"""CPU time of the learned dependency-to-constituency conversion alone, per source word.

Parses the first `--sentences` lines of a corpus with the processor's spaCy pipeline once, then times
`DependencyToConstituency.trees` over them in batches of 256 (as the processor calls it): cold, from a freshly loaded
conversion (every head's chain scored the first time its signature comes), and warm, the same sentences again (every
chain recalled, as most are deep into a large corpus). Each figure is the median of `--repeats` runs, one thread.

    python scripts/bench_conversion.py --source ../shared/data/multi30k/train.en.gz \
        --output benchmarks/conversion-cpu.json
"""

import argparse
import json
import platform
import statistics
import sys
import time
from itertools import islice

from mgsa_hf.benchmarking.rows import recorded_command
from mgsa_hf.constituency_conversion import MODEL_FILE, DependencyToConstituency
from mgsa_hf.syntax_parser import SyntaxParser
from mgsa_hf.syntax_spacy import word_arrays
from mgsa_hf.tokenization_utils import read_lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="one sentence per line (.gz ok)")
    parser.add_argument("--sentences", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", help="results JSON (default: print only)")
    return parser.parse_args(argv)


def timed_trees(conversion, parses, batch_size=256) -> float:
    """CPU seconds of converting `parses` in batches."""
    started = time.process_time()
    for start in range(0, len(parses), batch_size):
        conversion.trees(parses[start : start + batch_size])
    return time.process_time() - started


def main(argv=None) -> None:
    args = parse_args(argv)
    texts = list(islice(read_lines(args.source), args.sentences))
    parses = [word_arrays(doc)[:3] for doc in SyntaxParser().nlp.pipe(texts, batch_size=256)]
    words = sum(len(heads) for heads, _, _ in parses)
    cold, warm = [], []
    for _ in range(args.repeats):
        conversion = DependencyToConstituency.load(MODEL_FILE)
        cold.append(timed_trees(conversion, parses))
        warm.append(timed_trees(conversion, parses))
    result = {
        "command": recorded_command("scripts/bench_conversion.py", sys.argv[1:] if argv is None else argv),
        "machine": platform.platform(),
        "sentences": len(parses),
        "words": words,
        "cold_cpu_seconds_runs": [round(t, 3) for t in cold],
        "warm_cpu_seconds_runs": [round(t, 3) for t in warm],
        "cold_ms_per_word": round(statistics.median(cold) / words * 1e3, 4),
        "warm_ms_per_word": round(statistics.median(warm) / words * 1e3, 4),
    }
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as file:
            file.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
