"""Constituency trees: the learned dependency-to-constituency conversion, its training script, and the bracket
scoring against Penn Treebank gold trees."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MULTI30K_DIR, PTB_DIR

from mgsa_hf.constituency_conversion import DependencyToConstituency, default_conversion
from mgsa_hf.evaluation.treebank import (
    BracketScore,
    gold_sentences,
    ptb_files,
    read_ptb_file,
    sentence_text,
    tree_brackets,
)
from mgsa_hf.syntax_parser import SyntaxParser
from mgsa_hf.syntax_rules import derive_constituency_tree
from mgsa_hf.syntax_spacy import word_arrays
from mgsa_hf.syntax_trees import match_words, parse_ptb


ROOT = Path(__file__).resolve().parents[1]
PTB = PTB_DIR
MULTI30K = MULTI30K_DIR


def test_sentence_text_is_ordinary_text():
    leaves = ["``", "We", "do", "n't", "pay", "$", "5", "-LRB-", "or", "more", "-RRB-", "in", "the", "U.S.", ".", "''"]
    text, spans = sentence_text(leaves)
    assert text == '"We don\'t pay $5 (or more) in the U.S."'
    assert [text[start:end] for start, end in spans] == ['"', "We", "do", "n't", "pay", "$", "5", "(", "or", "more",
                                                          ")", "in", "the", "U.S.", "", '"']


def test_brackets_are_compared_on_characters_without_punctuation():
    """The same constituents over different tokenizations and punctuation placements score F1 1; moving one
    bracket costs exactly that bracket."""
    gold_tree, gold_leaves = parse_ptb("(S (NP (DT The) (NN cat)) (VP (VBZ does) (RB n't) (VP (VB sleep) (, ,) "
                                       "(ADVP (RB really) (RB well)))) (. .))")
    text, gold_spans = sentence_text(gold_leaves)
    assert text == "The cat doesn't sleep, really well."
    # a tokenizer that keeps "doesn't" whole and puts the comma and full stop at other levels
    words = ["The", "cat", "doesn't", "sleep", ",", "really", "well", "."]
    spans, position = [], 0
    for word in words:
        start = text.index(word, position)
        spans.append((start, start + len(word)))
        position = start + len(word)
    same, _ = parse_ptb("(S (NP (DT The) (NN cat)) (VP (VBZ doesn't) (VP (VB sleep) (, ,)) "
                        "(ADVP (RB really) (RB well)) (. .)))")
    gold = tree_brackets(gold_tree, [text[s:e] for s, e in gold_spans], gold_spans)
    predicted = tree_brackets(same, words, spans)
    # VP "does n't sleep , really well" and "doesn't sleep, really well" are one span; the inner VP over "sleep ,"
    # is one word without punctuation, no bracket; the gold inner VP is missed
    score = BracketScore()
    score.add(predicted, gold)
    assert score.summary()["unlabeled"]["precision"] == 1 and score.summary()["unlabeled"]["recall"] == 3 / 4
    assert {(text[s:e], label) for s, e, label in gold} == {
        ("The cat", "NP"), ("doesn't sleep, really well", "VP"), ("sleep, really well", "VP"), ("really well", "ADVP")}


@pytest.mark.skipif(not PTB.is_dir(), reason="needs ../shared/data/ptb-wsj-sample")
@pytest.mark.benchmark_tools  # the benchmark's own command (BENCHMARKS, "Constituency trees"): run with the tools
def test_eval_script_held_out_f1(tmp_path):
    """`scripts/eval_trees.py` on WSJ files the shipped conversion never saw (it is trained on 1-99): unlabeled
    bracket F1 >= 0.85, well above the hand-written rules and the right-branching baseline."""
    output = tmp_path / "trees.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "eval_trees.py"), "--ptb", str(PTB), "--files", "100-149",
                    "--output", str(output)], check=True, capture_output=True)
    report = json.loads(output.read_text())
    assert report["sentences"] > 1000
    learned, rules = report["conversions"]["learned"], report["conversions"]["rules"]
    assert learned["unlabeled"]["f1"] >= 0.85 and learned["labeled"]["f1"] >= 0.8
    assert learned["unlabeled"]["f1"] > rules["unlabeled"]["f1"] + 0.05
    assert report["conversions"]["right_branching"]["unlabeled"]["f1"] < 0.5
    assert min(learned["recall_by_label"].values()) > 0.75
    assert abs(learned["mean_depth"] - report["mean_gold_depth"]) < 1.5


@pytest.mark.skipif(not PTB.is_dir(), reason="needs ../shared/data/ptb-wsj-sample")
def test_every_wsj_tree_is_accepted_against_its_text(multi30k_processor):
    """Every gold tree of the WSJ sample spells its sentence's text, including the 19 that end in an abbreviation
    ("the U.S. ." as PTB writes it: the full stop takes the abbreviation's `.`); the processor makes their fields,
    a word per leaf, the last token in the last word."""
    abbreviated = []
    for path in sorted(PTB.glob("*.mrg")):
        for string in read_ptb_file(path):
            _, leaves = parse_ptb(string)
            text, _ = sentence_text(leaves)
            spans = match_words(text, leaves)
            assert all(end > start for start, end in spans) and "".join(text[s:e] for s, e in spans) == \
                "".join(text.split()), (path.name, text)
            if any(leaf == "." and i and leaves[i - 1] != "." and leaves[i - 1].endswith(".")
                   for i, leaf in enumerate(leaves)):
                abbreviated.append((text, string))
    assert len(abbreviated) == 19
    texts, trees = zip(*abbreviated, strict=True)
    encoding = multi30k_processor(list(texts), trees=list(trees))
    for i, (text, tree) in enumerate(abbreviated):
        words = multi30k_processor.syntax(text, tree).words
        word_ids = encoding["word_ids"][i][: sum(encoding["attention_mask"][i]) - 1]  # the last is `</s>`
        assert len(words) == len(parse_ptb(tree)[1])
        assert word_ids == sorted(word_ids) and word_ids[-1] == len(words) - 1
    with pytest.raises(ValueError, match="does not match the text"):
        match_words("in the U.S", ["in", "the", "U.S.", "."])


@pytest.mark.skipif(not PTB.is_dir(), reason="needs ../shared/data/ptb-wsj-sample")
def test_build_script_is_reproducible_and_learns(tmp_path):
    """Two builds on the same files, under different thread settings, write the same bytes (the fit's thread count
    is the script's, the gzip header holds no time or name); a model trained on a few files beats the rules on
    others."""
    outputs = [tmp_path / "a.json.gz", tmp_path / "b.json.gz"]
    for output, threads in zip(outputs, ("1", "2"), strict=True):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tree_model.py"), "--ptb", str(PTB), "--files",
                        "1-12", "--output", str(output)], check=True, capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
    assert gzip.decompress(outputs[0].read_bytes())  # a whole gzip file
    conversion = DependencyToConstituency.load(outputs[0])
    nlp = SyntaxParser().nlp
    scores = {"learned": BracketScore(), "rules": BracketScore()}
    sentences = gold_sentences(ptb_files(PTB, range(90, 100)))
    for (text, tree, words, spans), doc in zip(sentences, nlp.pipe([s[0] for s in sentences]), strict=True):
        heads, tags, deps, word_spans = word_arrays(doc)
        doc_words = [text[s:e] for s, e in word_spans]
        gold = tree_brackets(tree, words, spans)
        scores["learned"].add(tree_brackets(conversion.tree(heads, tags, deps), doc_words, word_spans), gold)
        scores["rules"].add(tree_brackets(derive_constituency_tree(heads, tags, deps), doc_words, word_spans), gold)
    assert scores["learned"].summary()["unlabeled"]["f1"] > scores["rules"].summary()["unlabeled"]["f1"]


def test_saved_processor_keeps_its_conversion(tmp_path, multi30k_processor):
    """`save_pretrained` writes the conversion model beside the processor and `from_pretrained` derives the trees with
    the folder's file (here a model trained on three WSJ files, whose trees differ from the shipped one's)."""
    from itertools import islice

    from mgsa_hf.constituency_conversion import MODEL_FILE
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    multi30k_processor.save_pretrained(tmp_path)
    assert (tmp_path / MODEL_FILE.name).read_bytes() == MODEL_FILE.read_bytes()
    if not PTB.is_dir():
        pytest.skip("needs ../shared/data/ptb-wsj-sample")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tree_model.py"), "--ptb", str(PTB), "--files", "1-3",
                    "--output", str(tmp_path / MODEL_FILE.name)], check=True, capture_output=True)
    loaded, small = MgsaProcessor.from_pretrained(tmp_path), DependencyToConstituency.load(tmp_path / MODEL_FILE.name)
    texts = list(islice(read_lines(f"{MULTI30K}/val.en.gz"), 30))
    differ = 0
    for text, syntax in zip(texts, loaded.parser(texts), strict=True):
        shipped = multi30k_processor.syntax(text)
        heads, tags, deps, _ = word_arrays(loaded.parser.nlp(text))
        assert syntax.to_ptb() == small.tree(heads, tags, deps).to_ptb(syntax.words)
        differ += syntax.to_ptb() != shipped.to_ptb()
    assert differ > 0
    assert loaded._fingerprint() != multi30k_processor._fingerprint()  # cached datasets follow the conversion


def test_learned_trees_cover_every_word():
    """On real sentences (Multi30k, several sentences in one text, one word, punctuation only) and on a non-projective
    parse, every tree covers all words under one root with contiguous nodes (`ConstituencyTree` checks that)."""
    from itertools import islice

    from mgsa_hf.tokenization_utils import read_lines

    texts = list(islice(read_lines(f"{MULTI30K}/val.en.gz"), 200)) + [
        "Hello.", "Go!", "...", "A dog runs. Then it sleeps on the red sofa.",
        "A hearing is scheduled on the issue today."]
    parser = SyntaxParser()
    for syntax in parser(texts):
        tree = syntax.tree
        assert tree.num_words == len(syntax.words) and all(path for path in tree.paths)
        root = tree.paths[0][0]
        assert all(path[0] == root for path in tree.paths)
        assert (tree.start[root], tree.end[root]) == (0, tree.num_words)
    # heads and labels as spaCy gives them, non-projective: "hearing ... on the issue" hangs across "is scheduled"
    heads, tags, deps = [1, 3, 3, 3, 1, 6, 4, 3, 3], ["DT", "NN", "VBZ", "VBN", "IN", "DT", "NN", "NN", "."], \
        ["det", "nsubjpass", "auxpass", "ROOT", "prep", "det", "pobj", "npadvmod", "punct"]
    tree = default_conversion().tree(heads, tags, deps)
    assert tree.num_words == 9 and (5, 7) in set(zip(tree.start, tree.end, strict=True))


def test_default_trees_are_the_learned_ones_and_rules_stay_available():
    text = "A man in a red shirt is riding a bike down the street."
    learned, rules = SyntaxParser()([text])[0], SyntaxParser(tree_parser="rules")([text])[0]
    # PTB's NP adjunction and nested VPs, which the rules flatten
    assert "(NP (NP (DT A) (NN man)) (PP (IN in)" in learned.to_ptb()
    assert "(VP (VBZ is) (VP (VBG riding)" in learned.to_ptb()
    assert "(NP (DT A) (NN man) (PP" in rules.to_ptb()
    assert learned.heads == rules.heads and learned.spans == rules.spans


def test_chains_recalled_by_head_signature_equal_scored_ones():
    """The conversion recalls a head's chain by its `head_signature` once it has scored one: on 300 real sentences
    (parsed trees, where most heads recur) and the non-projective parse, every tree equals the tree whose chains are
    all scored afresh, and most heads of the later sentences are recalled."""
    from itertools import islice

    from mgsa_hf.constituency_conversion import MODEL_FILE, _build_tree, projective_grid, word_dep_tags
    from mgsa_hf.tokenization_utils import read_lines

    texts = list(islice(read_lines(f"{MULTI30K}/train.en.gz"), 300))
    parses = [word_arrays(doc)[:3] for doc in SyntaxParser().nlp.pipe(texts)]
    parses.append(([1, 3, 3, 3, 1, 6, 4, 3, 3], ["DT", "NN", "VBZ", "VBN", "IN", "DT", "NN", "NN", "."],
                   ["det", "nsubjpass", "auxpass", "ROOT", "prep", "det", "pobj", "npadvmod", "punct"]))
    conversion = DependencyToConstituency.load(MODEL_FILE)  # a fresh one: its chains start unseen
    for heads, tags, deps in parses:
        projective, grid = projective_grid(heads, deps)
        scored = conversion._score_chains(grid, range(len(heads)), tags, deps, projective, word_dep_tags(tags, deps))
        expected = _build_tree(grid, projective, tags, scored, conversion._class_names)
        words = [str(word) for word in range(len(heads))]
        assert conversion.tree(heads, tags, deps).to_ptb(words) == expected.to_ptb(words)
    assert len(conversion._chains) < sum(len(heads) for heads, _, _ in parses) / 2
