"""Constituency trees from a dependency parse, by a conversion learned from Penn Treebank trees.

In a projective dependency tree, the constituents that a head word projects are nested spans: the head, then the
head with its nearest dependents, then with more of them, up to its whole subtree. With `k` left and `m` right
dependents (punctuation aside), every candidate is a point `(a, b)` of a `(k + 1) x (m + 1)` grid: the head plus
its `a` nearest left and `b` nearest right dependents' subtrees. A head's projection chain is a set of grid points
that grow on both sides (`a` and `b` never decrease), ending at the whole subtree. PTB's conventions pick the chain:
an NP takes its determiners and adjectives at one level and each post-modifier at a level of its own
(`(NP (NP a man) (PP in a red shirt))`), a clause takes its auxiliaries one by one (`(VP will (VP be (VP seen)))`)
and its subject last (`(S (NP he) (VP ...))`).

[`DependencyToConstituency`] scores each grid point with a log-linear model over features of the head and of the
dependents inside and just outside the point (their dependency labels and POS tags), and picks per head the chain
of greatest total score, then labels each chosen point with its most probable label chain (`S+VP` for an S whose only
child is a VP, ...). The model is trained by `scripts/build_tree_model.py` on the gold trees of a Penn Treebank
sample and parsed with the same spaCy pipeline; the package ships the result (`constituency_conversion.json.gz`).
"""

import functools
import gzip
import json
import zlib
from itertools import repeat
from pathlib import Path

import numpy as np

from .syntax_rules import projectivize
from .syntax_trees import ConstituencyTree


MODEL_FILE = Path(__file__).with_name("constituency_conversion.json.gz")
NO_CONSTITUENT = "-"
# dependency labels of punctuation: such dependents are no grid step; they join the smallest chosen point around them
_PUNCT_DEPS = frozenset({"punct"})
_SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass", "csubj", "csubjpass", "expl"})
_CACHE_SIZE = 1 << 16  # scored values kept per feature group


def projective_grid(heads: list[int], deps: list[str]) -> tuple[list[int], "HeadGrid"]:
    """`heads` (roots pointing to themselves) with non-projective arcs lifted, so that every subtree is contiguous,
    and their [`HeadGrid`]."""
    grid = HeadGrid(heads, deps)
    if grid.is_projective:
        return heads, grid
    heads = projectivize(list(heads))
    return heads, HeadGrid(heads, deps)


def _bottom_up(heads) -> list[int]:
    """Words ordered so that every dependent comes before its head (roots last). Assumes the heads form a forest."""
    children = [[] for _ in heads]
    order = [word for word, head in enumerate(heads) if head == word]
    for word, head in enumerate(heads):
        if head != word:
            children[head].append(word)
    for word in order:  # breadth-first from the roots
        order += children[word]
    return order[::-1]


class HeadGrid:
    """The candidate projections of every head of a projective dependency tree.

    Attributes:
        left_deps, right_deps (`list[list[int]]`): per word, its non-punctuation dependents on each side, nearest
            first.
        punct_deps (`list[list[int]]`): per word, its punctuation dependents.
        first, last (`list[int]`): per word, the first and last word of its subtree.
        size (`list[int]`): per word, the number of words of its subtree.
        order (`list[int]`): the words, every dependent before its head (roots last).
    """

    def __init__(self, heads: list[int], deps: list[str]):
        n = len(heads)
        self.left_deps, self.right_deps, self.punct_deps = ([[] for _ in range(n)] for _ in range(3))
        for word, head in enumerate(heads):  # in word order: each side's list comes out sorted
            if head == word:
                continue
            if deps[word] in _PUNCT_DEPS:
                self.punct_deps[head].append(word)
            else:
                (self.left_deps if word < head else self.right_deps)[head].append(word)
        for left in self.left_deps:
            left.reverse()  # nearest first
        self.first, self.last, self.size = list(range(n)), list(range(n)), [1] * n
        self.order = _bottom_up(heads)
        first, last, size = self.first, self.last, self.size
        for word in self.order:
            head = heads[word]
            if head != word:
                if first[word] < first[head]:
                    first[head] = first[word]
                if last[word] > last[head]:
                    last[head] = last[word]
                size[head] += size[word]

    @property
    def is_projective(self) -> bool:
        """Whether every subtree covers a contiguous span of words."""
        extents = zip(self.first, self.last, self.size, strict=True)
        return all(last - first + 1 == size for first, last, size in extents)

    def span(self, head: int, a: int, b: int) -> tuple[int, int]:
        """First and last word of point `(a, b)` of `head`; the whole subtree at the last point."""
        left, right = self.left_deps[head], self.right_deps[head]
        if a == len(left) and b == len(right):
            return self.first[head], self.last[head]
        return (self.first[left[a - 1]] if a else head), (self.last[right[b - 1]] if b else head)


def head_points(grid: HeadGrid, head: int, tags, deps, heads, dep_tags) -> list[tuple]:
    """The grid points of `head` as `(a, b, first, last, head_key, chain_key, span_key)`: the point, the first and
    last word of its span, and what its features depend on, in three groups (each scored once per distinct value, see
    [`DependencyToConstituency.tree`]): the head (its tag, dependency label, its head's tag); the point (the
    dependents just inside and outside it on each side, subject inside / outside, whether it is the whole subtree);
    its span (length, the tags at and around its edges). `dep_tags[w]` is `"{deps[w]}/{tags[w]}"`."""
    left, right = grid.left_deps[head], grid.right_deps[head]
    k, m, n = len(left), len(right), len(tags)
    tag, dep, parent = tags[head], deps[head], heads[head]
    head_key = (tag, dep, tags[parent] if parent != head else "ROOT")
    subjects = [i for i, word in enumerate(left) if deps[word] in _SUBJECT_DEPS]
    # per a (b): the first (last) word of the point's span, the dependent just inside and just outside it
    firsts, lasts = [head] + [grid.first[w] for w in left], [head] + [grid.last[w] for w in right]
    inside_left, outside_left = ["^"] + [dep_tags[w] for w in left], [dep_tags[w] for w in left] + ["$"]
    inside_right, outside_right = ["^"] + [dep_tags[w] for w in right], [dep_tags[w] for w in right] + ["$"]
    points = []
    for a in range(k + 1):
        subject = ("in" if subjects and subjects[0] < a else "") + ("out" if subjects and subjects[-1] >= a else "")
        for b in range(m + 1):
            full = (a == k) + 2 * (b == m)
            first, last = (grid.first[head], grid.last[head]) if full == 3 else (firsts[a], lasts[b])
            chain_key = (tag, dep, min(a, 3), min(b, 3), full, inside_left[a], outside_left[a], inside_right[b],
                         outside_right[b], subject)
            span_key = (min(last - first + 1, 8), tags[first], tags[last], tags[first - 1] if first else "^",
                        tags[last + 1] if last + 1 < n else "$")
            points.append((a, b, first, last, head_key, chain_key, span_key))
    return points


def word_dep_tags(tags, deps) -> list[str]:
    """`"{dep}/{tag}"` of every word, the form in which [`head_points`] describes dependents."""
    return [f"{dep}/{tag}" for dep, tag in zip(deps, tags, strict=True)]


def head_features(tag, dep, parent_tag) -> list[str]:
    """The features of a head word: its tag, with its dependency label and with its parent's tag."""
    return ["bias", f"t={tag}", f"td={tag}|{dep}", f"tp={tag}|{parent_tag}"]


def chain_features(tag, dep, a, b, full, inside_left, outside_left, inside_right, outside_right, subject) -> list[str]:
    """The features of a grid point (see [`head_points`]): the head's nearest `a` left and `b` right dependents (capped
    at 3), `full` (1: all left ones, 2: all right ones, 3: both), the dependents just inside and just outside the
    point on each side (`"{dep}/{tag}"`, `^` / `$` at the ends) and where the subject is."""
    return [
        f"tab={tag}|{a},{b}|{full}",
        f"full={full}",
        f"tfull={tag}|{dep}|{full}",
        f"il={inside_left}",
        f"ol={outside_left}",
        f"ir={inside_right}",
        f"or={outside_right}",
        f"til={tag}|{inside_left}",
        f"tol={tag}|{outside_left}",
        f"tir={tag}|{inside_right}",
        f"tor={tag}|{outside_right}",
        f"tolor={tag}|{outside_left}|{outside_right}",
        f"tilir={tag}|{inside_left}|{inside_right}",
        f"tilol={tag}|{inside_left}|{outside_left}",
        f"tiror={tag}|{inside_right}|{outside_right}",
        f"subj={tag}|{subject}",
    ]


def span_features(length, first_tag, last_tag, before_tag, after_tag) -> list[str]:
    """The features of a constituent's span: its length, the tags at its edges and the tags just outside it."""
    return [f"len={length}", f"edges={first_tag}|{last_tag}", f"around={before_tag}|{after_tag}"]


def point_features(head_key, chain_key, span_key) -> list[str]:
    """The features of a grid point from its keys (see [`head_points`])."""
    return head_features(*head_key) + chain_features(*chain_key) + span_features(*span_key)


class DependencyToConstituency:
    """A learned dependency-to-constituency conversion (see the module docstring).

    Args:
        features (`dict[str, int]`): row of each feature in `weights`.
        weights (`np.ndarray` of shape `(num_features, num_classes)`): log-linear weights.
        classes (`list[str]`): label chains, top-down and joined by `+`; [`NO_CONSTITUENT`] is the class of a point
            that is no constituent.
    """

    def __init__(self, features: dict[str, int], weights: np.ndarray, classes: list[str]):
        self.features, self.weights, self.classes = features, np.asarray(weights, dtype=np.float32), list(classes)
        self.none_class = self.classes.index(NO_CONSTITUENT)
        self._class_names = [label.split("+") for label in self.classes]  # a class's label chain, top-down
        self._weights_with_zero_row = np.concatenate([self.weights, np.zeros_like(self.weights[:1])])
        self._groups = tuple(_GroupScores(self, make) for make in (head_features, chain_features, span_features))
        self._chains = {}  # head_signature → chosen chain, filled on first use (bounded like the group tables)

    @classmethod
    def load(cls, path=MODEL_FILE) -> "DependencyToConstituency":
        """The model saved in `path` (gzipped JSON, as [`save`] writes it); an `OSError` naming the file when it is not
        one (cut short, overwritten, not gzipped, nested too deeply to read)."""
        try:
            with gzip.open(path, "rt", encoding="utf-8") as file:
                data = json.load(file)
            weights = np.asarray(data["weights"], dtype=np.float32).reshape(len(data["features"]),
                                                                          len(data["classes"]))
            return cls({feature: i for i, feature in enumerate(data["features"])}, weights, data["classes"])
        except FileNotFoundError:
            raise
        except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, RecursionError) as error:
            raise OSError(
                f"The tree model file {path} is damaged ({type(error).__name__}: {error}): it is not the gzipped "
                "JSON that `DependencyToConstituency.save` writes. Copy it again from where it was saved (a "
                "processor's folder keeps the one it was saved with; the package's own is "
                f"{MODEL_FILE.name} in mgsa_hf, restored by reinstalling mgsa-hf)."
            ) from error

    def save(self, path):
        """Writes the model as gzipped JSON, the same bytes for the same model: the gzip header holds no time and no
        file name."""
        features = sorted(self.features, key=self.features.get)
        weights = [round(float(weight), 4) for weight in self.weights.ravel()]
        data = {"classes": self.classes, "features": features, "weights": weights}
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as file:
            file.write(json.dumps(data, separators=(",", ":")).encode("utf-8"))

    def logits(self, features: list[list[str]]) -> np.ndarray:
        """Class scores of shape `(len(features), num_classes)` of points given by their feature lists (all of the
        same length); unknown features score nothing."""
        if not features:
            return np.zeros((0, len(self.classes)), np.float32)
        flat = [feature for point in features for feature in point]
        # unknown features read the row of zeros after the weights
        rows = np.fromiter(map(self.features.get, flat, repeat(len(self.features))), np.int64, len(flat))
        return self._weights_with_zero_row[rows.reshape(len(features), -1)].sum(1)

    def tree(self, heads: list[int], tags: list[str], deps: list[str]) -> ConstituencyTree:
        """The constituency tree of a sentence from its dependency parse.

        Args:
            heads: head index of each word, roots pointing to themselves (non-projective arcs are lifted).
            tags, deps: PTB POS tag and dependency label of each word.
        """
        return self.trees([(heads, tags, deps)])[0]

    def trees(self, parses: list[tuple[list[int], list[str], list[str]]]) -> list[ConstituencyTree]:
        """The constituency trees of a batch of sentences from their dependency parses `(heads, tags, deps)` (see
        [`tree`]): the trees of one `tree` call each, with the heads whose chains are not known yet scored together."""
        sentences, unseen = [], []  # unseen: (sentence, head, signature) of the heads to score
        for heads, tags, deps in parses:
            heads, grid = projective_grid(heads, deps)
            dep_tags = word_dep_tags(tags, deps)
            chains = {}
            # a leaf's signature (see `head_signature`), for all words at once
            parent_tags = [tags[parent] if parent != word else "ROOT" for word, parent in enumerate(heads)]
            n = len(tags)
            before, after = ["^", *tags][:n], [*tags[1:], "$"][:n]
            leaf_signatures = zip(tags, deps, parent_tags, before, after, strict=True)
            is_leaf = map(_no_dependents, grid.left_deps, grid.right_deps, grid.punct_deps)
            for head, (leaf_signature, leaf) in enumerate(zip(leaf_signatures, is_leaf, strict=True)):
                signature = leaf_signature if leaf else head_signature(grid, head, tags, deps, heads, dep_tags,
                                                                       before, after)
                chain = self._chains.get(signature)
                if chain is None:
                    unseen.append((len(sentences), head, signature))
                elif chain:
                    chains[head] = chain
            sentences.append((heads, tags, deps, grid, dep_tags, chains))
        if unseen:
            scored = self._score_heads([(*sentences[index][:5], head) for index, head, _ in unseen])
            if len(self._chains) + len(unseen) > _CACHE_SIZE:
                self._chains.clear()
            for (index, head, signature), chain in zip(unseen, scored, strict=True):
                self._chains[signature] = chain
                if chain:
                    sentences[index][5][head] = chain
        return [_build_tree(grid, heads, tags, chains, self._class_names)
                for heads, tags, _, grid, _, chains in sentences]

    def _score_chains(self, grid, chain_heads, tags, deps, heads, dep_tags) -> dict[int, tuple]:
        """The chosen chains (see [`_best_chain`]) of the heads `chain_heads` of one sentence that choose one."""
        chains = self._score_heads([(heads, tags, deps, grid, dep_tags, head) for head in chain_heads])
        return {head: chain for head, chain in zip(chain_heads, chains, strict=True) if chain}

    def _score_heads(self, heads_of_sentences: list[tuple]) -> list[tuple]:
        """The chosen chain of each `(heads, tags, deps, grid, dep_tags, head)` (`()` for none), scored from the
        grid points of all of them at once."""
        points, head_keys, chain_keys, span_keys, bounds = [], [], [], [], []
        for heads, tags, deps, grid, dep_tags, head in heads_of_sentences:
            first = len(points)
            for a, b, _, _, head_key, chain_key, span_key in head_points(grid, head, tags, deps, heads, dep_tags):
                points.append((a, b))
                head_keys.append(head_key)
                chain_keys.append(chain_key)
                span_keys.append(span_key)
            bounds.append((first, len(points)))
        # the model is linear: a point's logits are the sum of its feature groups' summed weights
        head_rows, chain_rows, span_rows = (group.rows_of(keys) for group, keys in zip(
            self._groups, (head_keys, chain_keys, span_keys), strict=True))
        head_group, chain_group, span_group = self._groups  # their tables once the rows are scored
        logits = head_group.table[head_rows] + chain_group.table[chain_rows] + span_group.table[span_rows]
        gain, best_label = _point_gains(logits, self.none_class)
        return [_best_chain(entry[3], entry[5], points[first:last], gain[first:last], best_label[first:last])
                for entry, (first, last) in zip(heads_of_sentences, bounds, strict=True)]


def _no_dependents(left, right, punct) -> bool:
    return not (left or right or punct)


def head_signature(grid: HeadGrid, head: int, tags, deps, heads, dep_tags, before, after) -> tuple:
    """Everything that the chain chosen for `head` depends on: its points' feature keys (see [`head_points`]) and
    whether it has punctuation dependents, in O(k + m) instead of the (k + 1)(m + 1) points (a leaf's: its word's
    tag and label, its head's tag and its neighbours' tags). A point's span length enters its key as min(length, 8),
    which the distances from the head to the span's edges, each capped at 8, give. Heads of the same signature choose
    the same chain; in Multi30k most heads (leaves and common phrases) share their signature with earlier ones.
    `before[w]` and `after[w]` are the tags next to word `w` (`^` and `$` at the ends)."""
    left, right, parent = grid.left_deps[head], grid.right_deps[head], heads[head]
    parent_tag = tags[parent] if parent != head else "ROOT"
    if not (left or right or grid.punct_deps[head]):  # a leaf: one point, the word itself
        return tags[head], deps[head], parent_tag, before[head], after[head]
    first, last = grid.first, grid.last
    # a span edge: its distance from the head (capped at 8), its tag and the tag outside it
    left_edges = tuple((min(head - first[w], 8), tags[first[w]], before[first[w]]) for w in left)
    right_edges = tuple((min(last[w] - head, 8), tags[last[w]], after[last[w]]) for w in right)
    subtree_first, subtree_last = first[head], last[head]
    return (
        tags[head],
        deps[head],
        parent_tag,
        bool(grid.punct_deps[head]),
        tuple(dep_tags[w] for w in left),
        tuple(dep_tags[w] for w in right),
        (0, tags[head], before[head]),
        (0, tags[head], after[head]),
        left_edges,
        right_edges,
        (min(head - subtree_first, 8), tags[subtree_first], before[subtree_first]),
        (min(subtree_last - head, 8), tags[subtree_last], after[subtree_last]),
    )


class _GroupScores:
    """The summed weights of one feature group per distinct key, as rows of a table filled on first use: the keys
    recur across sentences, so most points cost a dictionary lookup per group."""

    def __init__(self, conversion: DependencyToConstituency, make_features):
        self.conversion, self.make_features = conversion, make_features
        self.rows, self.table = {}, np.zeros((1024, len(conversion.classes)), np.float32)

    def rows_of(self, keys: list) -> list[int]:
        """The rows of `keys` in `table`; the keys not seen yet are scored together, in one `logits` call."""
        rows = self.rows
        found = list(map(rows.get, keys))
        if None not in found:
            return found
        unseen = list(dict.fromkeys(key for key, row in zip(keys, found, strict=True) if row is None))
        if len(rows) + len(unseen) > _CACHE_SIZE:  # full: start again with these keys alone
            rows.clear()
            unseen = list(dict.fromkeys(keys))
        first = len(rows)
        rows.update(zip(unseen, range(first, first + len(unseen)), strict=True))
        while first + len(unseen) > len(self.table):
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.table[first : first + len(unseen)] = self.conversion.logits([self.make_features(*key) for key in unseen])
        return list(map(rows.__getitem__, keys))


def _point_gains(logits, none_class) -> tuple[list[float], list[int]]:
    """Per grid point (a row of `logits`), the gain `log p(constituent) - log p(none)` and the best label class."""
    shifted = logits - logits.max(1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(1))
    none = shifted[:, none_class] - log_sum
    label_logits = shifted.copy()
    label_logits[:, none_class] = -np.inf
    some = np.log(np.maximum(1.0 - np.exp(none), 1e-12))
    return (some - none).tolist(), label_logits.argmax(1).tolist()


def _best_chain(grid, head, points, gain, best_label) -> tuple[tuple[int, int, int, bool], ...]:
    """The chosen points `(a, b, class, is_constituent)` of `head` from the innermost out, given its grid `points`
    `(a, b)` with their gains and best labels ([`_point_gains`]): the chain of greatest total score. The whole subtree
    ends every chain of a head with dependents, to hold them; `is_constituent` is false when it scores no more than
    none, and the tree then leaves that node out. `()` when no point is chosen."""
    grid_index = {point: index for index, point in enumerate(points)}
    k, m = len(grid.left_deps[head]), len(grid.right_deps[head])
    has_dependents = k + m + len(grid.punct_deps[head]) > 0
    # best[a][b]: best total of a chain ending at (a, b) (inclusive); back-pointers by prefix maxima
    best, back = {}, {}
    for a in range(k + 1):
        for b in range(m + 1):
            score = gain[grid_index[(a, b)]]
            forced = has_dependents and (a, b) == (k, m)
            if score <= 0 and not forced:
                continue
            previous = max(((best[p], p) for p in best if p[0] <= a and p[1] <= b), default=(0.0, None))
            best[(a, b)], back[(a, b)] = previous[0] + score, previous[1]
    if not best:
        return ()
    end = (k, m) if has_dependents else max(best, key=best.get)
    chain = []
    while end is not None:
        index = grid_index[end]
        chain.append((*end, best_label[index], gain[index] > 0))
        end = back[end]
    return tuple(chain[::-1])


def _build_tree(grid, heads, tags, chains, class_names) -> ConstituencyTree:
    """The tree of the chosen chains: each chosen point is a node (a unary chain of nodes for a label chain,
    `class_names[c]` top-down) whose children are the previous point's node and the dependents it adds; punctuation
    joins the innermost point whose span covers it. Nodes `0 .. n - 1` are the words' leaves."""
    n = len(heads)
    labels, parent = list(tags), [-1] * n  # -1: no parent (yet)
    left_out = set()  # nodes that hold dependents but are no constituent: their children join their parent
    top = list(range(n))  # per word, the outermost node of its projection
    for head in grid.order:
        chain = chains.get(head)
        if not chain:  # no chosen point: a word without dependents
            continue
        inner, point_nodes = head, []
        for a, b, label_class, is_constituent in chain:
            names = class_names[label_class]
            outer = len(labels)
            node = outer + len(names) - 1
            labels += names
            parent.append(-1)
            parent += range(outer, node)  # a label chain's nodes, each the child of the one before
            if not is_constituent and heads[head] != head:
                left_out.update(range(outer, node + 1))
            parent[inner] = node
            point_nodes.append((a, b, node))
            inner = outer
        top[head] = inner
        # the i-th nearest dependent on a side joins the first point that holds i dependents on that side (the
        # points grow on both sides)
        for side, deps in ((0, grid.left_deps[head]), (1, grid.right_deps[head])):
            point = 0
            for i, dep in enumerate(deps, 1):
                while point_nodes[point][side] < i:
                    point += 1
                parent[top[dep]] = point_nodes[point][2]
        for dep in grid.punct_deps[head]:
            host = point_nodes[-1][2]
            for a, b, node in point_nodes:
                first, last = grid.span(head, a, b)
                if first <= dep <= last:
                    host = node
                    break
            parent[top[dep]] = host
    roots = [top[w] for w in range(n) if heads[w] == w]
    if len(roots) > 1:
        root = len(labels)
        labels.append("S")
        parent.append(-1)
        for node in roots:
            parent[node] = root
    # each word's path from the root: its parent's path, kept per node, and the word's leaf
    path_of = {-1: ()}
    paths = []
    for w in range(n):
        up, node = [], parent[w]
        while node not in path_of:
            up.append(node)
            node = parent[node]
        path = path_of[node]
        for node in reversed(up):
            path = path_of[node] = path if node in left_out else path + (node,)
        paths.append([*path, w])
    return ConstituencyTree(paths, labels)


def default_conversion(path=None) -> DependencyToConstituency:
    """The conversion in the model file `path` (default: the one the package ships), loaded once per process."""
    return _load_conversion(str(path or MODEL_FILE))


@functools.cache
def _load_conversion(path: str) -> DependencyToConstituency:
    return DependencyToConstituency.load(path)
