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
import os
import platform
import tempfile

import spacy
import transformers
from transformers import AutoTokenizer

from mgsa_hf.benchmarking.preprocess import part_times, time_chunks
from mgsa_hf.processing_mgsa import MgsaProcessor
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
