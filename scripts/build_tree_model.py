"""Trains the dependency-to-constituency conversion (`mgsa_hf.constituency_conversion`) on gold Penn Treebank trees.

Each gold sentence's text is parsed with the processor's spaCy pipeline; every grid point of every head (the head
plus its nearest dependents, see the module) is an example whose class is the label chain of the gold constituent
covering the same characters (punctuation left out), or "no constituent". A multinomial logistic regression over
the points' features is fitted with L-BFGS; the package ships the result.

    python scripts/build_tree_model.py --ptb ../shared/data/ptb-wsj-sample --files 1-99 \
        --output src/mgsa_hf/constituency_conversion.json.gz
"""

import argparse
import time
from collections import Counter

import torch

from mgsa_hf.constituency_conversion import (
    NO_CONSTITUENT,
    DependencyToConstituency,
    head_points,
    point_features,
    projective_grid,
    word_dep_tags,
)
from mgsa_hf.evaluation.treebank import (
    base_label,
    content_span,
    content_words,
    gold_sentences,
    parse_file_ranges,
    ptb_files,
)
from mgsa_hf.syntax_spacy import load_spacy_pipeline, word_arrays


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptb", required=True, help="folder of wsj_NNNN.mrg gold trees")
    parser.add_argument("--files", default="1-99", help="file numbers to train on, e.g. 1-99")
    parser.add_argument("--parser-name", help="spaCy pipeline (default: the processor's)")
    parser.add_argument("--min-count", type=int, default=2, help="keep features seen at least this often")
    parser.add_argument("--min-chain-count", type=int, default=3,
                        help="label chains rarer than this keep their top label")
    parser.add_argument("--l2", type=float, default=1.0, help="L2 penalty on the weights (summed loss)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the fit; the sums' order, and so the weights, follow it (default 1, "
                             "the same weights whatever the core count)")
    parser.add_argument("--output", required=True)
    return parser.parse_args()


def gold_chains(tree, words, spans) -> dict:
    """Label chain (top-down, `+`-joined, function tags dropped) of the gold constituents per character span."""
    depth = {}
    for path in tree.paths:
        for node_depth, node in enumerate(path[:-1]):  # preterminals are not constituents
            depth[node] = node_depth
    by_span, content = {}, content_words(words)
    for node in sorted(depth, key=depth.get):
        span, _ = content_span(tree.start[node], tree.end[node], content, spans)
        if span is not None:
            by_span.setdefault(span, []).append(base_label(tree.label[node]))
    return {span: "+".join(labels) for span, labels in by_span.items()}


def examples(sentences, nlp):
    """Feature lists and gold label chains of every grid point of every sentence."""
    features, targets = [], []
    docs = nlp.pipe([text for text, *_ in sentences], batch_size=256)
    for (text, tree, gold_words, gold_spans), doc in zip(sentences, docs, strict=True):
        heads, tags, deps, spans = word_arrays(doc)
        content = content_words([text[start:end] for start, end in spans])
        heads, grid = projective_grid(heads, deps)
        chains = gold_chains(tree, gold_words, gold_spans)
        dep_tags = word_dep_tags(tags, deps)
        for head in range(len(heads)):
            for _, _, first, last, *keys in head_points(grid, head, tags, deps, heads, dep_tags):
                span, _ = content_span(first, last + 1, content, spans)
                features.append(point_features(*keys))
                targets.append(chains.get(span, NO_CONSTITUENT) if span is not None else NO_CONSTITUENT)
    return features, targets


def fit(features, targets, min_count, min_chain_count, l2) -> DependencyToConstituency:
    chain_counts = Counter(targets)
    targets = [t if chain_counts[t] >= min_chain_count else t.split("+")[0] for t in targets]
    classes = sorted(set(targets) | {NO_CONSTITUENT})
    counts = Counter(f for point in features for f in point)
    vocabulary = {f: i for i, f in enumerate(sorted(f for f, c in counts.items() if c >= min_count))}
    rows = [[vocabulary[f] for f in point if f in vocabulary] for point in features]
    offsets = torch.tensor([0] + [len(r) for r in rows[:-1]]).cumsum(0)
    flat = torch.tensor([i for r in rows for i in r])
    y = torch.tensor([classes.index(t) for t in targets])
    bag = torch.nn.EmbeddingBag(len(vocabulary), len(classes), mode="sum")
    torch.nn.init.zeros_(bag.weight)
    optimizer = torch.optim.LBFGS(bag.parameters(), lr=1, max_iter=500, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(bag(flat, offsets), y, reduction="sum") + l2 * bag.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return DependencyToConstituency(vocabulary, bag.weight.detach().numpy(), classes)


def main():
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    sentences = gold_sentences(ptb_files(args.ptb, parse_file_ranges(args.files)))
    start = time.perf_counter()
    features, targets = examples(sentences, load_spacy_pipeline(args.parser_name))
    conversion = fit(features, targets, args.min_count, args.min_chain_count, args.l2)
    conversion.save(args.output)
    print(f"{len(sentences)} sentences, {len(targets)} points, {len(conversion.features)} features, "
          f"{len(conversion.classes)} classes, {time.perf_counter() - start:.0f} s -> {args.output}")


if __name__ == "__main__":
    main()
