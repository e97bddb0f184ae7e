"""How far the PR paper's Algorithm 1 as printed is from the package's default reading, on Multi30k sentences.

The two readings (`MgsaProcessor(pr_segmentation_budget=...)`): `"words"`, at most n words per phrase with n from
the number of words (the default), and `"tokens_as_printed"`, the printed pseudo-code (n from the number of subword
tokens, sizes in tokens, the budget not lowered by a phrase's first subtree). Both run on the same spaCy parses and
subword tokens; the report gives how many sentences they segment alike, the mean phrase length in words, and the
share of phrases longer than the paper's ntok = max(min(8, seql / 6), 3) subword tokens (seql: tokens before EOS).

    python scripts/pr_segmentation_stats.py                      # 300 train sentences, the default recipe's tokenizer
    python scripts/pr_segmentation_stats.py --tokenizer runs/mgsa-multi30k --output stats.json
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

BUDGETS = ("words", "tokens_as_printed")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "multi30k"),
                        help="folder of train.en.gz and train.de.gz")
    parser.add_argument("--sentences", type=int, default=300, help="the first N English train sentences")
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: a joint 4000-piece vocabulary trained on "
                                            "the train split, as `mgsa-hf train` does)")
    parser.add_argument("--output", help="write the statistics as JSON here")
    return parser.parse_args(argv)


def load_tokenizer(args, folder):
    """The given tokenizer, or one trained into `folder`."""
    from transformers import AutoTokenizer

    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    return train_joint_tokenizer(f"{args.data}/train.en.gz", f"{args.data}/train.de.gz", folder, vocab_size=4000)


def phrase_statistics(encoding) -> list[dict]:
    """Per sentence: the phrase id of each token before EOS, each phrase's words and tokens, and ntok."""
    sentences = []
    for word_ids, phrase_ids in zip(encoding["word_ids"], encoding["pr_phrase_ids"], strict=True):
        word_ids, phrase_ids = word_ids[:-1], phrase_ids[:-1]  # EOS is its own phrase in both readings
        words, tokens = {}, {}
        for word, phrase in zip(word_ids, phrase_ids, strict=True):
            words.setdefault(phrase, set()).add(word)
            tokens[phrase] = tokens.get(phrase, 0) + 1
        ntok = max(min(8, len(word_ids) // 6), 3)
        sentences.append({"ids": phrase_ids, "words": [len(words[p]) for p in sorted(words)],
                          "tokens": [tokens[p] for p in sorted(tokens)], "ntok": ntok})
    return sentences


def main(argv=None):
    args = parse_args(argv)
    from mgsa_hf import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    texts = list(read_lines(f"{args.data}/train.en.gz", args.sentences))
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = load_tokenizer(args, folder)
    results = {budget: phrase_statistics(MgsaProcessor(tokenizer, pr_segmentation_budget=budget)(texts))
               for budget in BUDGETS}
    agree = sum(a["ids"] == b["ids"] for a, b in zip(*results.values(), strict=True))
    report = {"sentences": len(texts), "tokenizer": args.tokenizer or "joint unigram, 4000 pieces, Multi30k train",
              "parser": MgsaProcessor(tokenizer).parser.resolved_name, "segmented_alike": agree}
    for budget, sentences in results.items():
        words = [n for sentence in sentences for n in sentence["words"]]
        longer = sum(t > s["ntok"] for s in sentences for t in s["tokens"])
        report[budget] = {"phrases": len(words), "mean_words_per_phrase": round(sum(words) / len(words), 2),
                          "share_longer_than_ntok_tokens": round(longer / len(words), 3),
                          "max_tokens_per_phrase": max(t for s in sentences for t in s["tokens"])}
    print(json.dumps(report, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
