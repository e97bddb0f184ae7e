"""Scores the constituency trees the processor derives from spaCy's dependency parse against gold Penn Treebank trees.

For every gold tree of the chosen files, the sentence text is rebuilt from its leaves, parsed with the processor's
spaCy pipeline and converted to a constituency tree, by the learned conversion the package ships and by the
hand-written rules, and the brackets are compared on characters without punctuation (`mgsa_hf.evaluation.treebank`):
unlabeled and labeled precision / recall / F1 over spans of two or more words, the whole sentence excluded, the
share of gold NP / VP / PP / S / SBAR spans found, the mean tree depth, and the time per sentence of the parse and
of each conversion. A right-branching tree over the spaCy words is scored as a baseline.

    python scripts/eval_trees.py --ptb ../shared/data/ptb-wsj-sample --files 100-149 --output benchmarks/trees.json
"""

import argparse
import json
import platform
import sys
import time
from itertools import islice

import spacy

from mgsa_hf.benchmarking.rows import recorded_command
from mgsa_hf.constituency_conversion import DependencyToConstituency, default_conversion
from mgsa_hf.evaluation.treebank import (
    BracketScore,
    gold_sentences,
    parse_file_ranges,
    ptb_files,
    tree_brackets,
    tree_depth,
)
from mgsa_hf.syntax_rules import derive_constituency_tree
from mgsa_hf.syntax_spacy import load_spacy_pipeline, word_arrays
from mgsa_hf.syntax_trees import ConstituencyTree
from mgsa_hf.tokenization_utils import read_lines


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptb", required=True, help="folder of wsj_NNNN.mrg gold trees")
    parser.add_argument("--files", default="100-149", help="file numbers to score on, e.g. 100-149")
    parser.add_argument("--model", help="a conversion model file (default: the one the package ships)")
    parser.add_argument("--parser-name", help="spaCy pipeline (default: the processor's)")
    parser.add_argument("--corpus", help="also report the mean tree depth over this text file (one sentence per line)")
    parser.add_argument("--corpus-lines", type=int, default=1000, help="first lines of --corpus to use")
    parser.add_argument("--output", help="write the figures to this json file")
    return parser.parse_args()


def right_branching(n) -> ConstituencyTree:
    """(X w0 (X w1 (X w2 ...))) over n words."""
    paths, labels, spine = [], [], []
    for word in range(n):
        if word < n - 1:
            spine.append(len(labels))
            labels.append("X")
        paths.append(list(spine[: word + 1]) + [len(labels)])
        labels.append("W")
    return ConstituencyTree(paths, labels)


def main():
    args = parse_args()
    sentences = gold_sentences(ptb_files(args.ptb, parse_file_ranges(args.files)))
    if not sentences:
        raise SystemExit(f"no gold trees for files {args.files} in {args.ptb}")
    nlp = load_spacy_pipeline(args.parser_name)
    learned = DependencyToConstituency.load(args.model) if args.model else default_conversion()
    conversions = {
        "learned": learned.tree,
        "rules": derive_constituency_tree,
        "right_branching": lambda heads, tags, deps: right_branching(len(heads)),
    }
    texts = [text for text, *_ in sentences]
    list(nlp.pipe(texts[:50]))  # warm-up
    start = time.perf_counter()
    docs = list(nlp.pipe(texts, batch_size=256))
    parse_seconds = time.perf_counter() - start
    scores = {name: BracketScore() for name in conversions}
    depths = {name: 0 for name in conversions}
    seconds = dict.fromkeys(conversions, 0.0)
    gold_depth = 0
    for (text, gold_tree, leaves, leaf_spans), doc in zip(sentences, docs, strict=True):
        gold = tree_brackets(gold_tree, leaves, leaf_spans)
        gold_depth += tree_depth(gold_tree)
        heads, tags, deps, spans = word_arrays(doc)
        words = [text[s:e] for s, e in spans]
        for name, convert in conversions.items():
            start = time.perf_counter()
            tree = convert(heads, tags, deps)
            seconds[name] += time.perf_counter() - start
            scores[name].add(tree_brackets(tree, words, spans), gold)
            depths[name] += tree_depth(tree)
    n = len(sentences)
    report = {
        "command": recorded_command("scripts/eval_trees.py", sys.argv[1:]),
        "files": args.files,
        "sentences": n,
        "spacy_pipeline": f"{nlp.meta['lang']}_{nlp.meta['name']} {nlp.meta['version']} (spaCy {spacy.__version__})",
        "model": args.model or "package default",
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "mean_gold_depth": gold_depth / n,
        "spacy_parse_ms_per_sentence": 1000 * parse_seconds / n,
        "conversions": {
            name: {
                **scores[name].summary(),
                "mean_depth": depths[name] / n,
                "ms_per_sentence": 1000 * seconds[name] / n,
                "cost_vs_spacy_parse": seconds[name] / parse_seconds,
            }
            for name in conversions
        },
    }
    if args.corpus:
        lines = list(islice(read_lines(args.corpus), args.corpus_lines))
        corpus_depths = dict.fromkeys(conversions, 0)
        for doc in nlp.pipe(lines, batch_size=256):
            heads, tags, deps, _ = word_arrays(doc)
            for name, convert in conversions.items():
                corpus_depths[name] += tree_depth(convert(heads, tags, deps)) if heads else 0
        report["corpus_mean_depth"] = {"corpus": f"{args.corpus} (first {len(lines)} lines)",
                                       **{name: depth / len(lines) for name, depth in corpus_depths.items()}}
        print("mean depth on the corpus:", {name: round(d / len(lines), 2) for name, d in corpus_depths.items()})
    for name, result in report["conversions"].items():
        unlabeled, labeled = result["unlabeled"], result["labeled"]
        by_label = " ".join(f"{label} {recall:.3f}" for label, recall in result["recall_by_label"].items())
        scores = " | ".join(f"{kind} P {values['precision']:.3f} R {values['recall']:.3f} F1 {values['f1']:.3f}"
                            for kind, values in (("unlabeled", unlabeled), ("labeled", labeled)))
        print(f"{name:16s} {scores} | recall {by_label} | depth {result['mean_depth']:.2f} | "
              f"{result['ms_per_sentence']:.3f} ms/sentence")
    print(f"{n} sentences; gold depth {report['mean_gold_depth']:.2f}; spaCy parse "
          f"{report['spacy_parse_ms_per_sentence']:.2f} ms/sentence")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(report, file, indent=2)
            file.write("\n")


if __name__ == "__main__":
    main()
