"""A PTB-like constituency tree from a dependency parse by hand-written rules ([`derive_constituency_tree`], the
processor's `tree_parser="rules"`), and the projectivisation that both it and the learned conversion
([`~mgsa_hf.constituency_conversion.DependencyToConstituency`]) apply to non-projective parses.
"""

from .syntax_trees import ConstituencyTree, NonContiguousSpanError


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
    except NonContiguousSpanError:
        return ConstituencyTree(*_derived_paths(projectivize(list(heads)), tags, deps))


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


def projectivize(heads):
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
