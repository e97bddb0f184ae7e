"""What keeps preparing a parsed corpus cheap gives the results of the plain code: the derived trees of a batch of
sentences, the fields' range check and the garbage collector left out of the steps' objects."""

import gc

import pytest

from mgsa_hf.constituency_conversion import DependencyToConstituency, default_conversion
from mgsa_hf.training import corpus as preparation


# (heads, tags, deps) of a few sentences: a clause with a subject, auxiliaries and a post-modified NP, a sentence with
# punctuation and two roots, a non-projective parse, a one-word sentence and an empty one
PARSES = [
    ([1, 3, 3, 3, 5, 3, 7, 5, 3], ["DT", "NN", "MD", "VB", "IN", "NN", "IN", "NN", "."],
     ["det", "nsubj", "aux", "ROOT", "prep", "pobj", "prep", "pobj", "punct"]),
    ([1, 1, 1, 4, 4, 4], ["NNS", "VBP", ".", "PRP", "VBZ", "."], ["nsubj", "ROOT", "punct", "nsubj", "ROOT", "punct"]),
    ([1, 3, 3, 3, 1, 6, 4, 3, 3], ["DT", "NN", "VBZ", "VBN", "IN", "DT", "NN", "NN", "."],
     ["det", "nsubjpass", "auxpass", "ROOT", "prep", "det", "pobj", "npadvmod", "punct"]),
    ([0], ["UH"], ["ROOT"]),
    ([], [], []),
]


def fresh() -> DependencyToConstituency:
    """The shipped conversion with its caches empty."""
    model = default_conversion()
    return DependencyToConstituency(model.features, model.weights, model.classes)


def ptb(tree) -> str:
    return tree.to_ptb([str(word) for word in range(tree.num_words)])


def test_trees_of_a_batch_equal_one_tree_call_each():
    """`trees` gives each sentence the tree of its own `tree` call on a fresh conversion, also where sentences of
    the batch share heads that no earlier sentence had (scored twice in the batch, chosen alike)."""
    batch = PARSES + PARSES[:3]
    alone = [ptb(fresh().tree(*parse)) for parse in batch]
    conversion = fresh()
    assert [ptb(tree) for tree in conversion.trees(batch)] == alone
    assert "(VP (MD 2) (VP (VB 3)" in alone[0] and alone[-1] == alone[2]
    # a second batch recalls the chains: the same trees from the cache
    assert [ptb(tree) for tree in conversion.trees(batch[::-1])] == alone[::-1]
    assert [ptb(conversion.tree(*parse)) for parse in batch] == alone


def test_new_feature_keys_are_scored_as_one_by_one():
    """The summed weights of the feature keys scored together in one batch equal those scored one key at a time, also
    across a full table that starts again."""
    together = fresh()
    for parse in PARSES:
        together.tree(*parse)
    one_by_one = fresh()
    for group, single in zip(together._groups, one_by_one._groups, strict=True):
        keys = list(group.rows)
        rows = [single.rows_of([key])[0] for key in keys]
        assert len(keys) > 5 and (group.table[[group.rows[key] for key in keys]] == single.table[rows]).all()
    group, keys = one_by_one._groups[1], list(together._groups[1].rows)
    table = group.table[group.rows_of(keys)].copy()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mgsa_hf.constituency_conversion._CACHE_SIZE", len(keys))  # full: starts again
        assert (group.table[group.rows_of(keys[:3] + [("unseen",) * 10] * 3)] == table[:3].tolist() + [
            group.table[group.rows[("unseen",) * 10]].tolist()] * 3).all()
        assert len(group.rows) == 4


class _Rows:
    """A processor whose batch is the rows given in it."""

    def _map_batch(self, batch, indices, parses=None, **kwargs):
        return {name: [list(row) for row in values] for name, values in batch["rows"].items()}


@pytest.mark.parametrize("column, rows, message", [
    ("phrase_tags", [[[-100, 3], [4, 5]], [[-200, 1]]], "row 8: `phrase_tags` holds -200, outside the int8"),
    ("phrase_ids", [[[0, 1]], [[5, 70000]]], "row 8: `phrase_ids` holds 70000, outside the int16"),
    ("input_ids", [[], [1, 40000]], "row 8: `input_ids` holds 40000, outside the int16"),
])
def test_range_check_names_the_value_of_every_field_shape(column, rows, message):
    """The range check reads every value of the flat and the levelled fields (empty rows and levels too) and names
    the first row and value out of range; rows in range pass untouched."""
    features = preparation.processed_features(["input_ids", "phrase_ids", "phrase_tags", "labels"], 1000)
    check = preparation._NarrowRows(_Rows(), features, "train")
    fine = {"input_ids": [[1, 2], []], "phrase_ids": [[[0, 1], [0, 0]], []], "phrase_tags": [[[-100, 3]], [[]]],
            "labels": [[3], [32767]]}
    assert check({"rows": fine}, [7, 8]) == fine
    with pytest.raises(ValueError, match=message):
        check({"rows": {**fine, column: rows}}, [7, 8])


def test_frozen_gc_covers_the_steps_and_ends_with_them():
    """The parse and field steps run with the objects alive before them frozen; after them nothing stays frozen."""
    seen = []

    @preparation.frozen_gc()
    def step():
        seen.append(gc.get_freeze_count())

    before = gc.get_freeze_count()
    step()
    assert seen[0] > 1000 and gc.get_freeze_count() == before == 0
    for name in ("build_processed", "build_parsed"):
        assert getattr(preparation, name).__wrapped__.__name__ == name
