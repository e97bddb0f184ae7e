"""Train a joint subword vocabulary on a parallel corpus and save it as a Hugging Face tokenizer.

    python scripts/train_tokenizer.py --source train.en.gz --target train.de.gz --output tokenizers/multi30k-8k \
        --vocab-size 8000 [--type marian] [--max-sentences 100000]

The tokenizer loads with `AutoTokenizer.from_pretrained(output)` (or `MgsaProcessor(tokenizer)`); its special tokens
follow Marian (`</s>` 0, `<unk>` 1, `<pad>` 2), which the printed config fields repeat.
"""

import argparse

from mgsa_hf.tokenization_utils import TOKENIZER_TYPES, train_joint_tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", nargs="+", required=True, help="source-side text files (.gz ok)")
    parser.add_argument("--target", nargs="+", required=True, help="target-side text files (.gz ok)")
    parser.add_argument("--output", required=True, help="folder to save the tokenizer in")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--type", choices=TOKENIZER_TYPES, default="fast", help="fast tokenizer or Marian format")
    parser.add_argument("--max-sentences", type=int, help="use only the first lines of each file")
    args = parser.parse_args()

    tokenizer = train_joint_tokenizer(
        args.source,
        args.target,
        args.output,
        vocab_size=args.vocab_size,
        tokenizer_type=args.type,
        max_sentences=args.max_sentences,
    )
    print(f"saved {type(tokenizer).__name__} with {len(tokenizer)} tokens to {args.output}")
    print(
        f"model config: vocab_size={len(tokenizer)}, eos_token_id={tokenizer.eos_token_id}, "
        f"pad_token_id={tokenizer.pad_token_id}, decoder_start_token_id={tokenizer.pad_token_id}"
    )


if __name__ == "__main__":
    main()
