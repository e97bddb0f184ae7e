#!/usr/bin/env python
"""Translate sentences (one per line) with a saved MGSA model folder, in batches, through the translation pipeline.

Lines end at a line feed (`\\n`; the `\\r` of a `\\r\\n` ending is dropped): every input line gives one output line,
whatever other line-breaking characters (a lone `\\r`, U+2028, ...) it holds. Decoding follows the model's generation
config (its folder's `generation_config.json`: beam size, length bound) unless `--num-beams`, `--max-length` or
`--max-new-tokens` say otherwise. A line longer than the model's positions stops the run with an error naming it,
unless `--truncation` or `--max-source-length` cut it.

    echo "A man rides a bike." | python scripts/translate.py runs/mgsa-multi30k
    python scripts/translate.py runs/mgsa-multi30k --input test.en --output test.hyp.de --num-beams 4
"""

import argparse
import io
import sys

from tqdm import tqdm
from transformers import pipeline

import mgsa_hf  # noqa: F401  (registers the translation pipeline)
from mgsa_hf.cli import positive_int
from mgsa_hf.pipeline_translation import SourceTooLongError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="saved model folder (model + processor)")
    parser.add_argument("--input", help="file of source sentences (default: standard input)")
    parser.add_argument("--output", help="file for the translations (default: standard output)")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--num-beams", type=positive_int, help="beam size (default: the model's generation config)")
    parser.add_argument("--max-length", type=positive_int,
                        help="most tokens of a translation, EOS included (default: the model's generation config)")
    parser.add_argument("--max-new-tokens", type=positive_int,
                        help="most tokens of a translation, instead of --max-length (default: the model's "
                             "generation config)")
    parser.add_argument("--max-source-length", type=positive_int,
                        help="cut source sentences to this many tokens (default: none is cut)")
    parser.add_argument("--truncation", action="store_true",
                        help="cut source sentences to the tokenizer's model_max_length, or to the model's positions "
                             "where they are fewer (default: none is cut)")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def read_lines(source) -> list[str]:
    """The lines of a text stream opened with `newline=""`, split at `\\n` only, without their `\\n` or `\\r\\n`."""
    lines = source.read().split("\n")
    if lines[-1] == "":  # the last line's line feed, or an empty input
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.input:
        with open(args.input, encoding="utf-8", newline="") as source:
            sentences = read_lines(source)
    elif hasattr(sys.stdin, "buffer"):  # standard input, without Python's universal newlines
        sentences = read_lines(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline=""))
    else:
        sentences = read_lines(sys.stdin)
    options = {name: getattr(args, name) for name in ("num_beams", "max_length", "max_new_tokens", "max_source_length")
               if getattr(args, name) is not None}
    if args.truncation:
        options["truncation"] = True
    translator = pipeline("translation", model=args.model, device=args.device)
    output = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    # a generator in, translations streamed out as each batch is done
    rows = translator((sentence for sentence in sentences), batch_size=args.batch_size, **options)
    try:
        for (row,) in tqdm(rows, total=len(sentences), desc="translating", unit="sentence",
                           disable=args.input is None):
            output.write(row["translation_text"] + "\n")
    except SourceTooLongError as error:
        line = sentences.index(error.sentence) + 1
        raise SystemExit(
            f"translate.py: error: {args.input or '<stdin>'}, line {line}: {error.num_tokens} tokens, more than the "
            f"model's {error.limit} positions: pass --truncation or --max-source-length {error.limit} to cut it."
        ) from None
    output.flush()


if __name__ == "__main__":
    main()
