"""Penn Treebank files as a reference for constituency trees: reading `.mrg` files, the sentence text of a gold tree,
and bracket precision / recall / F1 between trees over different tokenizations.

Brackets are compared by the characters they cover, punctuation left out, so a gold tree over PTB tokens and a tree
over spaCy tokens can be scored against each other: a constituent is the character span from its first to its last
non-punctuation word. Counted are constituents of two or more non-punctuation words, the whole sentence excluded
(the usual unlabeled / labeled bracket F1 over spans of two or more words). Labels lose PTB function tags and
indices (`NP-SBJ-1` is `NP`).
"""

import re
import unicodedata
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..syntax_trees import PTB_UNESCAPE, ConstituencyTree, parse_ptb


# leaves written without a space before them, and after them, when a PTB sentence is turned back into text
_NO_SPACE_BEFORE = frozenset({",", ".", ":", ";", "!", "?", "%", "''", "-RRB-", "-RCB-", "-RSB-", "n't", "'s", "'re",
                              "'ve", "'ll", "'d", "'m", "'S", "'RE", "'VE", "'LL", "'D", "'M", "N'T"})  # fmt: skip
_NO_SPACE_AFTER = frozenset({"$", "#", "``", "-LRB-", "-LCB-", "-LSB-"})
_TEXT_FORM = {leaf: forms[0] for leaf, forms in PTB_UNESCAPE.items() if leaf not in ("`", "'")} | {"``": '"'}


def read_ptb_file(path) -> list[str]:
    """The bracketed trees of a `.mrg` file, one string per tree (a tree may span several lines)."""
    trees, depth, current = [], 0, []
    for token in re.findall(r"\(|\)|[^\s()]+", Path(path).read_text()):
        current.append(token)
        depth += {"(": 1, ")": -1}.get(token, 0)
        if depth == 0 and token == ")":
            trees.append(" ".join(current).replace("( ", "(").replace(" )", ")"))
            current = []
    return trees


def ptb_files(folder, numbers) -> list[Path]:
    """The `wsj_NNNN.mrg` files of `folder` with the given numbers (those present)."""
    paths = [Path(folder) / f"wsj_{number:04d}.mrg" for number in numbers]
    return [path for path in paths if path.is_file()]


def parse_file_ranges(ranges: str) -> list[int]:
    """`"1-99"` or `"100-149,160"` as a list of numbers."""
    numbers = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        numbers.extend(range(int(first), int(last or first) + 1))
    return numbers


def sentence_text(leaves: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The text of a sentence from its PTB leaves, spaced as ordinary text (no space before `,` or `n't`, none
    after `$` or an opening quote), and each leaf's character span in it."""
    text, spans = "", []
    for i, leaf in enumerate(leaves):
        form = _TEXT_FORM.get(leaf, leaf)
        glue = i == 0 or leaf in _NO_SPACE_BEFORE or leaves[i - 1] in _NO_SPACE_AFTER
        if leaf == "." and i and leaves[i - 1] != "." and leaves[i - 1].endswith("."):
            form = ""  # "U.S. ." is the text "U.S."; the sentence's full stop is the abbreviation's
        text += "" if glue or not form else " "
        spans.append((len(text), len(text) + len(form)))
        text += form
    return text, spans


def is_punctuation(word: str) -> bool:
    """Whether a word is all punctuation (Unicode categories P*), such as `,` `--` `"` `...` (or empty)."""
    return all(unicodedata.category(char).startswith("P") for char in word)


def base_label(label: str) -> str:
    """A PTB label without function tags and indices (`NP-SBJ-1` is `NP`); `-LRB-` and the like stay as they are."""
    return label if label.startswith("-") else re.split(r"[-=]", label, maxsplit=1)[0]


def content_words(words: list[str]) -> list[int]:
    """The indices of the words that are not punctuation."""
    return [i for i, word in enumerate(words) if not is_punctuation(word)]


def content_span(start: int, end: int, content: list[int], spans) -> tuple[tuple[int, int] | None, int]:
    """The character span from the first to the last non-punctuation word among the words `start .. end - 1`, and
    how many there are (`None, 0` for none); `content` is [`content_words`] of the sentence, `spans` the words'
    character spans."""
    first, stop = bisect_left(content, start), bisect_left(content, end)
    if first == stop:
        return None, 0
    return (spans[content[first]][0], spans[content[stop - 1]][1]), stop - first


def tree_brackets(tree: ConstituencyTree, words: list[str], spans: list[tuple[int, int]]) -> Counter:
    """Labeled brackets `(start_char, end_char, label)` of the inner constituents of `tree` (see the module
    docstring), as a multiset. `words[i]` covers the characters `spans[i]`."""
    content = content_words(words)
    brackets = Counter()
    sentence, _ = content_span(0, len(words), content, spans)
    for node, label in enumerate(tree.label):
        span, count = content_span(tree.start[node], tree.end[node], content, spans)
        if count >= 2 and span != sentence:
            brackets[(*span, base_label(label))] += 1
    return brackets


@dataclass
class BracketScore:
    """Counts of matched, predicted and gold brackets, unlabeled and labeled, and per gold label."""

    matched: int = 0
    predicted: int = 0
    gold: int = 0
    labeled_matched: int = 0
    labeled_predicted: int = 0
    labeled_gold: int = 0
    gold_by_label: Counter = field(default_factory=Counter)
    found_by_label: Counter = field(default_factory=Counter)

    def add(self, predicted: Counter, gold: Counter):
        """Adds one sentence: multisets of `(start, end, label)` brackets."""
        predicted_spans = Counter((start, end) for start, end, _ in predicted.elements())
        gold_spans = Counter((start, end) for start, end, _ in gold.elements())
        # unlabeled brackets as sets of spans (a unary chain is one bracket), labeled ones as multisets
        self.matched += len(set(predicted_spans) & set(gold_spans))
        self.predicted += len(predicted_spans)
        self.gold += len(gold_spans)
        self.labeled_matched += sum((predicted & gold).values())
        self.labeled_predicted += sum(predicted.values())
        self.labeled_gold += sum(gold.values())
        for (start, end, label), count in gold.items():
            self.gold_by_label[label] += count
            self.found_by_label[label] += count if (start, end) in predicted_spans else 0

    @staticmethod
    def _prf(matched, predicted, gold) -> dict:
        precision, recall = matched / max(predicted, 1), matched / max(gold, 1)
        f1 = 2 * precision * recall / max(precision + recall, 1e-12)
        return {"precision": precision, "recall": recall, "f1": f1}

    def summary(self, labels=("NP", "VP", "PP", "S", "SBAR")) -> dict:
        """Unlabeled and labeled P/R/F1, and per gold label the share of its brackets found (as a span)."""
        return {
            "unlabeled": self._prf(self.matched, self.predicted, self.gold),
            "labeled": self._prf(self.labeled_matched, self.labeled_predicted, self.labeled_gold),
            "recall_by_label": {
                label: self.found_by_label[label] / max(self.gold_by_label[label], 1) for label in labels
            },
            "brackets": {"gold": self.gold, "predicted": self.predicted, "matched": self.matched},
        }


def tree_depth(tree: ConstituencyTree) -> int:
    """Depth of the tree: the most nodes on a root-to-leaf path, the leaf's preterminal included."""
    return max((len(path) for path in tree.paths), default=0)


def gold_sentences(paths) -> list[tuple[str, ConstituencyTree, list[str], list[tuple[int, int]]]]:
    """Per gold tree of the files: its text, its tree, its words (the leaves as they stand in the text, `"` for
    `` `` ``) and their character spans in the text."""
    sentences = []
    for path in paths:
        for string in read_ptb_file(path):
            tree, leaves = parse_ptb(string)
            text, spans = sentence_text(leaves)
            sentences.append((text, tree, [text[start:end] for start, end in spans], spans))
    return sentences
