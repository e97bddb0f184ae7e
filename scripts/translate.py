#!/usr/bin/env python
"""Translate sentences (one per line) with a saved MGSA model folder, in batches, through the translation pipeline.

    echo "A man rides a bike." | python scripts/translate.py runs/mgsa-multi30k
    python scripts/translate.py runs/mgsa-multi30k --input test.en --output test.hyp.de --num-beams 4
"""

import argparse
import sys

from tqdm import tqdm
from transformers import pipeline

import mgsa_hf  # noqa: F401  (registers the translation pipeline)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="saved model folder (model + processor)")
    parser.add_argument("--input", help="file of source sentences (default: standard input)")
    parser.add_argument("--output", help="file for the translations (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    source = open(args.input, encoding="utf-8") if args.input else sys.stdin
    sentences = [line.rstrip("\n") for line in source]
    translator = pipeline("translation", model=args.model, device=args.device)
    output = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    batches = range(0, len(sentences), args.batch_size)
    for start in tqdm(batches, desc="translating", unit="batch", disable=args.input is None):
        batch = sentences[start : start + args.batch_size]
        for row in translator(batch, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens):
            output.write(row["translation_text"] + "\n")
        output.flush()


if __name__ == "__main__":
    main()
