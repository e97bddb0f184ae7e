"""Constituency trees over words and Penn Treebank brackets.

* [`ConstituencyTree`] gives the granularity levels (MG-SA), the PR paper's Algorithm 1 phrases and the RHE local
  phrases (Rule 1) over words; the processor maps them to subword tokens. [`SentenceSyntax`] is one sentence's
  analysis: words, dependency heads and tree.
* [`parse_ptb`] reads a PTB bracketed string (a user's tree, or a parser plug-in's), [`match_words`] finds its
  leaves in the text, [`read_tree`] does both and names the sentence in its [`TreeError`].
* [`PHRASE_TAGS`] and [`PhraseTagVocab`]: the tag vocabulary of MG-SA's phrase-tag supervision.
"""

import itertools
import re
from dataclasses import dataclass


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


class NonContiguousSpanError(ValueError):
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
                    raise NonContiguousSpanError(
                        f"Node {node} ({label[node]}) does not cover a contiguous span of words."
                    )

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
        """The number of words (leaves) of the tree."""
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

    def to_parse(self) -> dict[str, list]:
        """The analysis without its text, as plain lists ([`PARSE_FIELDS`]): `spans` (num_words, 2), `heads`
        (num_words,), `paths` (num_words, depth of each word) and `labels` (num_nodes,). What a cache of parses
        stores; [`SentenceSyntax.from_parse`] gives the analysis back."""
        return {"spans": [list(span) for span in self.spans], "heads": list(self.heads),
                "paths": [list(path) for path in self.tree.paths], "labels": list(self.tree.label)}

    @classmethod
    def from_parse(cls, text: str, parse: dict, index: int = 0) -> "SentenceSyntax":
        """The analysis of `text` from its [`SentenceSyntax.to_parse`] dict (also as read back from Arrow).

        Raises:
            `ValueError` naming sentence `index` when `parse` lacks a field, its word fields differ in length or its
            words reach past the end of `text` (the parse of another sentence)."""
        missing = [name for name in PARSE_FIELDS if name not in parse]
        if missing:
            raise ValueError(f"parses[{index}] lacks {missing}: a parse holds {list(PARSE_FIELDS)} (see "
                             "SentenceSyntax.to_parse).")
        spans, heads, paths = parse["spans"], parse["heads"], parse["paths"]
        if not len(spans) == len(heads) == len(paths):
            raise ValueError(f"parses[{index}] has {len(spans)} spans, {len(heads)} heads and {len(paths)} paths: one "
                             "of each per word.")
        if spans and spans[-1][1] > len(text):
            raise ValueError(f"parses[{index}] has words up to character {spans[-1][1]} of a text of {len(text)} "
                             f"characters: it is the parse of another sentence ({text!r}).")
        return cls(text, [tuple(span) for span in spans], list(heads), ConstituencyTree(paths, parse["labels"]))


# the fields of a sentence's parse dict (`SentenceSyntax.to_parse`)
PARSE_FIELDS = ("spans", "heads", "paths", "labels")


# --------------------------------------------------------------------------------------------------------------------
# Penn Treebank brackets

_PTB_TOKEN = re.compile(r"\(|\)|[^\s()]+")
# text forms a PTB leaf may stand for, besides itself
PTB_UNESCAPE = {
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
    of the text, has extra words or splits the text differently (leaves `a ca` for "a cat") is rejected. One
    exception, as PTB writes it: a sentence that ends in an abbreviation ("the U.S.") has a leaf `.` after it, which
    takes the abbreviation's last character (the spans of `U.S.` `.` are those of `U.S` and `.`).

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
        if _abbreviation_full_stop(leaves, index) and not text.startswith(".", position):
            # "the U.S." ends a sentence: PTB writes the abbreviation, then the full stop `.` again; the text has one
            # `.`, which the full stop takes (every word keeps at least one character: `U.S` and `.`)
            start, end = spans[-1]
            spans[-1] = (start, end - 1)
            spans.append((end - 1, end))
            continue
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


def _abbreviation_full_stop(leaves: list[str], index: int) -> bool:
    """Whether leaf `index` is a full stop `.` that PTB writes after a word ending in `.` (an abbreviation)."""
    return leaves[index] == "." and index > 0 and leaves[index - 1] != "." and leaves[index - 1].endswith(".")


def _clipped(text: str, limit: int = 200) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def _leaf_forms(leaf: str) -> tuple[str, ...]:
    """The texts a PTB leaf may stand for: itself, its bracket or quote unescaped, `\\/` and `\\*` unescaped."""
    forms = (leaf, *PTB_UNESCAPE.get(leaf, ()))
    if "\\" in leaf:
        forms += (leaf.replace("\\/", "/").replace("\\*", "*"),)
    return forms


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


def read_tree(text: str, tree: str, index: int, tree_parser: str | None):
    """The tree of a PTB string and the character spans of its leaves in `text`, or a [`TreeError`] naming sentence
    `index` (and `tree_parser`, the plug-in that made the tree)."""
    try:
        parsed, leaves = parse_ptb(tree)
        return parsed, match_words(text, leaves)
    except ValueError as error:
        raise TreeError(index, str(error), tree_parser) from None
