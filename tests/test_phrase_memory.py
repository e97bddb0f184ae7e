"""MG-SA (encoder_type="phrase_memory"): partitions, compositions, ON-LSTM, the Table 1-3 configs, equivalence with
word-level attention, padding invariance, attention and tag-loss masking, generation with beams, vectorisation."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import tiny_sizes
from torch.utils._python_dispatch import TorchDispatchMode

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration
from mgsa_hf.modeling_attention import MgsaAttention
from mgsa_hf.modeling_syntax_inputs import MgsaSyntaxInputs
from mgsa_hf.on_lstm import OnLstm
from mgsa_hf.variant_phrase_memory import PhraseMemoryAttention, PhraseMemoryInputs, ngram_phrase_ids, phrase_partition


CONFIG_DIR = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "rows" / "phrase_memory"
# the rows at a size of their own (Transformer-big: `big_*.json`) are the base rows' fields at that size
ROWS = sorted(path.stem for path in CONFIG_DIR.glob("*.json") if "d_model" not in json.loads(path.read_text()))
PAD, EOS = 49, 0
TINY = tiny_sizes(vocab_size=50, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=EOS,
                  forced_eos_token_id=EOS, num_phrase_tags=8)
# per sentence, per level (top 3 of the tree): the sizes of its phrases in tokens, EOS excluded
TREES = [
    [[1, 5], [1, 1, 2, 2], [1, 1, 1, 1, 1, 1]],
    [[2, 2], [1, 1, 2], [1, 1, 1, 1]],
    [[2], [1, 1], [1, 1]],
    [[3, 4], [1, 2, 2, 2], [1, 2, 1, 1, 1, 1]],
]
NEW_MODULES = ("composition", "interaction", "tag_classifier", "phrase_key_value")


def mgsa_config(row: str | None = None, **kwargs) -> MgsaConfig:
    fields = json.loads((CONFIG_DIR / f"{row}.json").read_text()) if row else {"encoder_type": "phrase_memory"}
    return MgsaConfig(**{**TINY, **fields, **kwargs})


def make_batch(trees: list, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded sources (EOS last) with hand-made `phrase_ids` / `phrase_tags` following `syntax_fields.py`."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [sum(levels[0]) + 1 for levels in trees]
    width = max(lengths)
    input_ids = torch.full((len(trees), width), PAD)
    phrase_ids = torch.full((len(trees), 3, width), -1)
    phrase_tags = torch.full((len(trees), 3, width), -100)
    for row, (levels, length) in enumerate(zip(trees, lengths, strict=True)):
        input_ids[row, : length - 1] = torch.randint(1, PAD, (length - 1,), generator=generator)
        input_ids[row, length - 1] = EOS
        for level, sizes in enumerate(levels):
            start = 0
            for phrase, size in enumerate(sizes):
                phrase_ids[row, level, start : start + size] = phrase
                phrase_tags[row, level, start : start + size] = 1 + (phrase + level) % 7
                start += size
            phrase_ids[row, level, start] = len(sizes)
    labels = torch.randint(1, PAD, (len(trees), 5), generator=generator)
    labels[:, -1] = EOS
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids.ne(PAD).long(),
        "phrase_ids": phrase_ids,
        "phrase_tags": phrase_tags,
        "labels": labels,
    }


def real_config(processor, row: str | None = None, **kwargs) -> MgsaConfig:
    """A tiny config for the Multi30k processor's vocabulary (`num_phrase_tags` covers its tag vocabulary)."""
    tokenizer = processor.tokenizer
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "forced_eos_token_id": tokenizer.eos_token_id,
        "num_phrase_tags": len(processor.phrase_tags),
    }
    return mgsa_config(row, **{**special, **kwargs})


@pytest.fixture(scope="module")
def multi30k_batch(multi30k_processor, multi30k_val):
    """A real processor batch: the first 6 Multi30k val pairs, padded, with every syntax field."""
    sources, targets = (sentences[:6] for sentences in multi30k_val)
    return dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))


def sentence(batch: dict, row: int) -> dict[str, torch.Tensor]:
    """Sentence `row` of a batch alone, without padding."""
    length = int(batch["attention_mask"][row].sum())
    return {key: value[row : row + 1, ..., :length] for key, value in batch.items() if key != "labels"}


def syntax_of(batch: dict) -> MgsaSyntaxInputs:
    return MgsaSyntaxInputs(
        padding_mask=batch["attention_mask"].bool(), phrase_ids=batch["phrase_ids"], phrase_tags=batch["phrase_tags"]
    )


def inputs_of(config: MgsaConfig, batch: dict) -> PhraseMemoryInputs:
    """What the encoder passes the MG-SA layers for `batch`."""
    return PhraseMemoryInputs.from_syntax(config, syntax_of(batch))


def test_ngram_partition():
    padding_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]).bool()
    expected = torch.tensor(
        [
            [[0, 0, 1, 1, 2, 2, 3], [0, 0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1, 2]],
            [[0, 0, 1, 2, -1, -1, -1], [0, 0, 0, 1, -1, -1, -1], [0, 0, 0, 1, -1, -1, -1]],
            [[0, -1, -1, -1, -1, -1, -1]] * 3,
        ]
    )
    assert torch.equal(ngram_phrase_ids(padding_mask, [2, 3, 4]), expected)
    partition = phrase_partition(mgsa_config("ngram_sans_layer_0"), MgsaSyntaxInputs(padding_mask=padding_mask))
    assert partition.num_phrases == 4
    assert partition.phrase_mask.sum(-1).tolist() == [[4, 3, 3], [3, 2, 2], [1, 1, 1]]


def test_syntactic_partition_reads_top_levels():
    batch = make_batch(TREES[:2])
    partition = phrase_partition(mgsa_config("syntactic", phrase_levels=2), syntax_of(batch))
    assert torch.equal(partition.phrase_ids, batch["phrase_ids"][:, :2])
    assert partition.num_phrases == 5
    assert partition.phrase_mask.sum(-1).tolist() == [[3, 5], [3, 4]]


def test_on_lstm_matches_reference():
    """The chunked, fused ON-LSTM against the per-neuron equations of Shen et al. (2018)."""
    torch.manual_seed(0)
    hidden_size, chunk = 12, 4
    on_lstm = OnLstm(6, hidden_size, chunk)
    torch.nn.init.normal_(on_lstm.hidden_gates.weight, std=0.5)
    inputs = torch.randn(3, 5, 6)
    outputs, (last_hidden, last_cell) = on_lstm(inputs)

    def cumax(x):
        return torch.softmax(x, -1).cumsum(-1).repeat_interleave(chunk, -1)

    hidden, cell, expected = torch.zeros(3, hidden_size), torch.zeros(3, hidden_size), []
    chunks = hidden_size // chunk
    for step in range(5):
        gates = on_lstm.input_gates(inputs[:, step]) + on_lstm.hidden_gates(hidden)
        master_f, master_i = cumax(gates[:, :chunks]), 1 - cumax(gates[:, chunks : 2 * chunks])
        f, i, o, c_hat = gates[:, 2 * chunks :].view(3, 4, chunks, chunk).unbind(1)
        f, i, o, c_hat = (t.flatten(1) for t in (f.sigmoid(), i.sigmoid(), o.sigmoid(), c_hat.tanh()))
        omega = master_f * master_i
        cell = (f * omega + master_f - omega) * cell + (i * omega + master_i - omega) * c_hat
        hidden = o * cell.tanh()
        expected.append(hidden)
    torch.testing.assert_close(outputs, torch.stack(expected, 1))
    torch.testing.assert_close(last_hidden, hidden)
    torch.testing.assert_close(last_cell, cell)
    # causal: later inputs never change earlier outputs (what padding invariance relies on)
    changed = inputs.clone()
    changed[:, 3:] = torch.randn(3, 2, 6)
    torch.testing.assert_close(on_lstm(changed)[0][:, :3], outputs[:, :3])

    # packed sequences of different lengths: each runs as if alone, h_T / c_T are those of its own last step
    lengths = torch.tensor([2, 5, 3])
    packed = torch.nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
    packed_outputs, (packed_hidden, packed_cell) = on_lstm(packed)
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(packed_outputs, batch_first=True)
    for row, length in enumerate(lengths.tolist()):
        alone, (alone_hidden, alone_cell) = on_lstm(inputs[row : row + 1, :length])
        torch.testing.assert_close(padded[row, :length], alone[0])
        torch.testing.assert_close(packed_hidden[row], alone_hidden[0])
        torch.testing.assert_close(packed_cell[row], alone_cell[0])


@pytest.mark.parametrize("composition", ["max", "mean", "sans", "lstm"])
def test_compositions_match_per_phrase_reference(composition):
    """Eq. 8 computed for all phrases at once equals COM applied to each phrase's word vectors on its own (SANs:
    each phrase head with its own W_q^h, W_k^h)."""
    torch.manual_seed(0)
    attention = PhraseMemoryAttention(mgsa_config("syntactic", phrase_composition=composition), 4, layer_idx=0)
    module = attention.composition
    batch = make_batch(TREES)
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    partition = phrase_partition(attention.config, syntax_of(batch))
    phrases = module(hidden, partition)
    assert phrases.shape[-1] == (32 if composition in ("max", "mean") else 3 * 8)  # 3 phrase heads of d_h = 8

    def reference(words):
        if composition == "max":
            return words.max(0).values
        if composition == "mean":
            return words.mean(0)
        if composition == "lstm":
            return module.lstm(words.unsqueeze(0))[1][0][-1, 0]
        return sans_of_phrase(module, words)

    for row in range(len(TREES)):
        for granularity in range(3):
            ids = partition.phrase_ids[row, granularity]
            for phrase in range(int(ids.max()) + 1):
                expected = reference(hidden[row, ids == phrase])
                torch.testing.assert_close(phrases[row, granularity, phrase], expected, atol=1e-5, rtol=1e-5)
            assert (phrases[row, granularity, int(ids.max()) + 1 :] == 0).all()


def sans_of_phrase(module, words: torch.Tensor) -> torch.Tensor:
    """SANs (Eq. 8) of one phrase's words (n, D), head by head with each head's W_q^h, W_k^h: (d_m,)."""
    head_dim, heads = module.head_dim, module.output_dim // module.head_dim
    parts = []
    for head in range(heads):
        rows = slice(head_dim * head, head_dim * (head + 1))
        query = words.max(0).values @ module.query_proj.weight[rows].T
        keys = words @ module.key_proj.weight[rows].T
        parts.append(torch.softmax(keys @ query / head_dim**0.5, 0) @ keys)
    return torch.cat(parts)


def sans_reference(module, hidden: torch.Tensor, partition) -> torch.Tensor:
    """SANs phrase by phrase: (B, G, P, d_m), empty phrases 0."""
    batch_size, num_granularities, num_phrases = partition.phrase_mask.shape
    rows = []
    for row in range(batch_size):
        for granularity in range(num_granularities):
            ids = partition.phrase_ids[row, granularity]
            for phrase in range(num_phrases):
                words = hidden[row, ids == phrase]
                rows.append(sans_of_phrase(module, words) if len(words) else hidden.new_zeros(module.output_dim))
    return torch.stack(rows).view(batch_size, num_granularities, num_phrases, -1)


@pytest.mark.parametrize("partition_type", ["ngram", "syntactic"])
def test_sans_gradients_match_per_phrase_reference(partition_type):
    """The segment-wise SANs composition (scores recomputed in the backward pass) gives the gradients of the
    per-phrase reference, for the words and for W_q^h, W_k^h."""
    torch.manual_seed(0)
    config = mgsa_config(phrase_partition=partition_type, phrase_composition="sans", phrase_tag_supervision=False)
    module = PhraseMemoryAttention(config, 4, layer_idx=0).composition
    batch = make_batch(TREES)
    partition = phrase_partition(config, syntax_of(batch))
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    phrases_grad = torch.randn(*partition.phrase_mask.shape, module.output_dim)

    def gradients(compose):
        module.zero_grad()
        words = hidden.clone().requires_grad_(True)
        (compose(words) * phrases_grad).sum().backward()
        return words.grad, module.query_proj.weight.grad.clone(), module.key_proj.weight.grad.clone()

    batched = gradients(lambda words: module(words, partition))
    reference = gradients(lambda words: sans_reference(module, words, partition))
    for got, expected in zip(batched, reference, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_sans_keeps_word_sized_tensors_for_backward():
    """What the SANs composition keeps for the backward pass grows with the sentence length L, not with
    phrases × words (P × L): doubling L at most doubles it."""
    torch.manual_seed(0)
    config = mgsa_config("ngram_sans_layer_0")
    module = PhraseMemoryAttention(config, 4, layer_idx=0).composition

    def kept_bytes(length: int) -> int:
        padding_mask = torch.ones(2, length, dtype=torch.bool)
        partition = phrase_partition(config, MgsaSyntaxInputs(padding_mask=padding_mask))
        hidden = torch.randn(2, length, 32, requires_grad=True)
        storages = {}

        def keep(tensor):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            module(hidden, partition)
        return sum(storages.values())

    assert kept_bytes(256) <= 2.2 * kept_bytes(128)


def test_head_space_memory_is_read_by_each_head():
    """A head-space memory (SANs): phrase head h of granularity g attends over keys H_g^h W_K^h and values
    H_g^h W_V^h of its own d_h-wide part of g's memory (Eq. 5), checked against an explicit loop over heads."""
    torch.manual_seed(0)
    config = mgsa_config("syntactic", attn_implementation="eager", phrase_heads_per_granularity=[1, 0, 2])
    attention = PhraseMemoryAttention(config, 4, layer_idx=0).eval()
    assert attention.memory_in_head_space
    batch = make_batch(TREES)
    inputs = inputs_of(config, batch)
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    output, weights, _ = attention(hidden, syntax=inputs)
    partition = inputs.partition
    memory = attention.composition(hidden, partition)  # (B, G, P, 24)
    query = attention.split_heads(attention.query_proj(hidden))
    padding = batch["attention_mask"].bool()
    word_keys = attention.split_heads(attention.key_proj(hidden))[:, 0]
    word_values = attention.split_heads(attention.value_proj(hidden))[:, 0]
    scores = (query[:, 0] @ word_keys.transpose(1, 2) / 8**0.5).masked_fill(~padding[:, None], float("-inf"))
    contexts = [torch.softmax(scores, -1) @ word_values]
    for head, granularity in ((1, 0), (2, 2), (3, 2)):
        part = memory[:, granularity, :, 8 * (head - 1) : 8 * head]
        keys = part @ attention.phrase_key_value.key_weight[head - 1]
        values = part @ attention.phrase_key_value.value_weight[head - 1]
        scores = query[:, head] @ keys.transpose(1, 2) / 8**0.5
        scores = scores.masked_fill(~partition.phrase_mask[:, granularity, None, :], float("-inf"))
        expected = torch.softmax(scores, -1)
        torch.testing.assert_close(weights[:, head, :, : partition.num_phrases], expected, atol=1e-5, rtol=1e-5)
        contexts.append(expected @ values)
    expected_output = attention.output_proj(torch.cat(contexts, -1))
    torch.testing.assert_close(output, expected_output, atol=1e-5, rtol=1e-5)


# parameters each MG-SA row adds to Transformer-base (512d, 6+6, 8 heads: 2 word heads and 6 phrase heads), in
# millions: Tables 1-3 (88.0M baseline; Table 1 rows in all 6 layers, Table 2 per layer range, Table 3 bottom layer)
PAPER_ADDED = {
    "ngram_max_layers_0-5": 0.0,  # Table 1 MAX-POOLING 88.0M
    "ngram_sans_layers_0-5": 2.4,  # Table 1 SANs 90.4M
    "ngram_lstm_layers_0-5": 8.1,  # Table 1 LSTM 96.1M
    "ngram_sans_layers_0-2": 1.2,  # Table 2 [1-3] 89.2M
    "ngram_sans_layer_0": 0.4,  # Table 2 [1] 88.4M
    "syntactic": 0.4,  # Table 3 row 3
    "syntactic_tag": 0.4,  # row 4
    "syntactic_tag_lstm": 1.5,  # row 5, 89.5M
    "syntactic_tag_on_lstm": 1.9,  # row 6, 89.9M
}


@pytest.mark.parametrize("row", sorted(PAPER_ADDED))
def test_table_parameter_counts_at_base_size(row):
    """Every row's added parameters are the paper's within 15% (plus the 0.1M to which the paper rounds its two
    counts); the baseline row adds nothing."""
    base = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=32000, pad_token_id=2,
                decoder_start_token_id=2, eos_token_id=0, num_phrase_tags=64)
    fields = json.loads((CONFIG_DIR / f"{row}.json").read_text())
    with torch.device("meta"):
        plain = MgsaForConditionalGeneration(MgsaConfig(**base)).num_parameters()
        added = (MgsaForConditionalGeneration(MgsaConfig(**{**base, **fields})).num_parameters() - plain) / 1e6
    paper = PAPER_ADDED[row]
    assert abs(added - paper) <= 0.15 * paper + 0.1, (row, added, paper)
    if paper == 0.0:
        assert added == 0.0


@pytest.mark.parametrize("row", ROWS)
def test_config_rows_train(row, multi30k_processor, multi30k_batch):
    """Every Table 1-3 config builds (6-layer encoder, as Transformer-Base), runs forward + backward on a real
    Multi30k processor batch with a finite loss, and every MG-SA parameter gets a non-zero gradient."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, row, encoder_layers=6)).train()
    output = model(**multi30k_batch)
    assert torch.isfinite(output.loss)
    output.loss.backward()
    new = {name: p for name, p in model.named_parameters() if any(m in name.split(".") for m in NEW_MODULES)}
    config = model.config
    expected_layers = config.phrase_memory_layers if config.encoder_type == "phrase_memory" else []
    layers = model.get_encoder().layers
    mgsa_layers = [i for i, layer in enumerate(layers) if isinstance(layer.self_attn, PhraseMemoryAttention)]
    assert mgsa_layers == expected_layers
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new.values()), [
        name for name, p in new.items() if p.grad is None or p.grad.abs().sum() == 0
    ]
    if config.encoder_type == "phrase_memory" and config.phrase_tag_supervision:
        assert torch.isfinite(output.tag_loss) and output.tag_loss > 0
        labels = multi30k_batch["labels"]
        torch.testing.assert_close(output.loss, output.translation_loss
                                   + 0.001 * output.tag_loss * len(labels) / labels.ne(-100).sum())
    else:
        assert output.tag_loss is None


@pytest.mark.parametrize("sizes,word_heads", [([1, 1, 1], None), ([1], 1), ([1, 1], 0)])
def test_phrase_size_one_is_word_attention(sizes, word_heads):
    """Phrases of one token, max composition and no interaction: every head is plain word-level attention."""
    torch.manual_seed(0)
    config = mgsa_config("ngram_sans_layer_0", phrase_ngram_sizes=sizes, phrase_word_heads=word_heads,
                         phrase_composition="max")
    mgsa = PhraseMemoryAttention(config, 4, layer_idx=0).eval()
    plain = MgsaAttention(config, 4, layer_idx=0).eval()
    plain.load_state_dict(mgsa.state_dict())
    padding_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    hidden = torch.randn(2, 7, 32)
    additive = torch.zeros(2, 1, 7, 7).masked_fill(~padding_mask[:, None, None], torch.finfo(torch.float).min)
    expected, _, _ = plain(hidden, attention_mask=additive)
    actual, _, _ = mgsa(hidden, syntax=PhraseMemoryInputs.from_syntax(config, MgsaSyntaxInputs(padding_mask)))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)

    # the same at model level: logits equal those of the plain Transformer with the same weights
    batch = make_batch(TREES[:2])
    del batch["phrase_ids"], batch["phrase_tags"]
    model = MgsaForConditionalGeneration(config).eval()
    baseline = MgsaForConditionalGeneration(mgsa_config(encoder_type="transformer")).eval()
    baseline.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, baseline(**batch).logits, atol=1e-5, rtol=1e-5)
    # not vacuous: larger phrases change the output
    model.config.phrase_ngram_sizes = [2] * len(sizes)
    with torch.no_grad():
        assert (model(**batch).logits - baseline(**batch).logits).abs().max() > 1e-3


@pytest.mark.parametrize(
    "fields",
    [
        {"phrase_partition": "ngram", "phrase_composition": "sans", "phrase_tag_supervision": False,
         "phrase_interaction": "none"},
        {"phrase_partition": "ngram", "phrase_composition": "lstm", "phrase_tag_supervision": False},
        {"phrase_partition": "ngram", "phrase_composition": "mean", "phrase_tag_supervision": False,
         "phrase_interaction": "lstm"},
        {},  # the default: syntactic, SANs, tag supervision, ON-LSTM
        {"phrase_composition": "lstm", "phrase_interaction": "none"},
        {"phrase_composition": "max", "phrase_tag_supervision": False, "phrase_interaction": "lstm"},
    ],
)
def test_padding_invariance(fields, multi30k_processor, multi30k_batch):
    """Each Multi30k sentence alone and inside the padded batch: same encoder output (and tag loss)."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor, **fields)).eval()
    batch = multi30k_batch
    assert batch["attention_mask"].sum(-1).unique().numel() > 3  # really padded
    encoder = model.get_encoder()
    with torch.no_grad():
        batched = encoder(**{k: v for k, v in batch.items() if k != "labels"})
        for row in range(len(batch["input_ids"])):
            alone = encoder(**sentence(batch, row))
            length = alone.last_hidden_state.shape[1]
            torch.testing.assert_close(
                batched.last_hidden_state[row, :length], alone.last_hidden_state[0], atol=1e-4, rtol=1e-4
            )
            if model.config.phrase_tag_supervision:
                torch.testing.assert_close(batched.tag_loss[row : row + 1], alone.tag_loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("partition", ["ngram", "syntactic"])
def test_padded_phrases_get_zero_attention(partition):
    torch.manual_seed(0)
    config = mgsa_config(phrase_partition=partition, phrase_tag_supervision=partition == "syntactic",
                         attn_implementation="eager")
    attention = PhraseMemoryAttention(config, 4, layer_idx=0).eval()
    batch = make_batch(TREES)
    inputs = inputs_of(config, batch)
    _, weights, _ = attention(torch.randn(*batch["input_ids"].shape, 32), syntax=inputs)
    real_phrases = inputs.partition.phrase_mask.sum(-1)  # (B, G)
    lengths = batch["attention_mask"].sum(-1)
    for row in range(len(TREES)):
        word_weights = weights[row, 0]
        assert (word_weights[:, lengths[row] :] == 0).all() and (word_weights[:, : lengths[row]] > 0).all()
        for head, granularity in enumerate(range(3), start=1):
            count = real_phrases[row, granularity]
            assert (weights[row, head, :, count:] == 0).all()
            assert (weights[row, head, :, :count] > 0).all()
            torch.testing.assert_close(weights[row, head, :, :count].sum(-1), torch.ones(weights.shape[2]))


def test_tag_loss_matches_per_phrase_cross_entropy():
    """Eq. 9-10 per sentence, L_tag = -Σ_i log p(t_i) summed over the real tagged phrases of every level (padding,
    padded phrases and EOS are ignored); the model's `tag_loss` is its mean over the batch's sentences and `loss` adds
    λ times it."""
    torch.manual_seed(0)
    config = mgsa_config("syntactic_tag", phrase_composition="max")
    attention = PhraseMemoryAttention(config, 4, layer_idx=0)
    batch = make_batch(TREES)
    # values at padding positions must not matter
    batch["phrase_tags"] = batch["phrase_tags"].masked_fill(batch["phrase_ids"] < 0, 5)
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    tag_loss = attention(hidden, syntax=inputs_of(config, batch))[2].tag_loss

    expected = []
    for row, levels in enumerate(TREES):
        losses = []
        for level, sizes in enumerate(levels):
            start = 0
            for phrase, size in enumerate(sizes):
                vector = hidden[row, start : start + size].max(0).values
                tag = torch.tensor(1 + (phrase + level) % 7)
                losses.append(torch.nn.functional.cross_entropy(attention.tag_classifier(vector), tag))
                start += size
        expected.append(torch.stack(losses).sum())
    torch.testing.assert_close(tag_loss, torch.stack(expected))

    # the model: the batch's tag loss is the mean of the sentences' sums, weighted by λ in the loss
    model = MgsaForConditionalGeneration(config)
    per_sentence = []
    model.get_encoder().layers[0].self_attn.register_forward_hook(
        lambda module, args, outputs: per_sentence.append(outputs[2].tag_loss)
    )
    output = model(**batch)
    assert per_sentence[0].shape == (len(TREES),)
    torch.testing.assert_close(output.tag_loss, per_sentence[0].mean())
    # Eq. 12 sums both terms per sentence: the tag term is the batch's sum over its target tokens, as the translation
    # loss is
    sentences, tokens = len(batch["labels"]), batch["labels"].ne(-100).sum()
    torch.testing.assert_close(output.loss, output.translation_loss
                               + config.phrase_tag_loss_weight * output.tag_loss * sentences / tokens)


def test_generate_with_beams_matches_single_sentences(multi30k_processor, multi30k_batch):
    torch.manual_seed(0)
    config = real_config(multi30k_processor, "syntactic_tag_on_lstm", decoder_layers=2)
    model = MgsaForConditionalGeneration(config).eval()
    batch = {k: v[:4] for k, v in multi30k_batch.items()}
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    kwargs = dict(num_beams=4, max_new_tokens=8, do_sample=False)
    batched = model.generate(**inputs, **kwargs)
    for row in range(len(batched)):
        alone = model.generate(**sentence(batch, row), **kwargs)[0]
        assert batched[row, : alone.shape[0]].tolist() == alone.tolist()
        assert (batched[row, alone.shape[0] :] == config.pad_token_id).all()
    assert len({tuple(row) for row in batched.tolist()}) > 1


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:  # views are free, and packed RNNs slice per batch-size change
            self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def count_ops(attention: PhraseMemoryAttention, batch: dict) -> Counter:
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    with torch.no_grad(), OpCounter() as counter:
        attention(hidden, syntax=inputs_of(attention.config, batch))
    return counter.counts


@pytest.mark.parametrize(
    "fields",
    [
        {"phrase_composition": "max", "phrase_interaction": "none"},
        {"phrase_composition": "mean", "phrase_interaction": "lstm"},
        {"phrase_composition": "sans", "phrase_interaction": "none"},
        {"phrase_composition": "lstm", "phrase_interaction": "lstm"},
        {"phrase_composition": "sans", "phrase_interaction": "on_lstm"},
    ],
)
def test_forward_is_vectorised(fields):
    """The ops run (forward + backward) do not depend on the number of sentences, nor — apart from the ON-LSTM's
    steps over the phrase sequence — on the number of phrases."""
    torch.manual_seed(0)
    attention = PhraseMemoryAttention(mgsa_config("syntactic_tag", **fields), 4, layer_idx=0)
    # same padded length and number of phrase slots, different numbers of sentences and of real phrases
    few_phrases = [[[1, 5], [1, 5], [1, 1, 1, 1, 1, 1]], [[1], [1], [1]]]
    many_phrases = [TREES[0]] * 3 + [TREES[2]]
    assert count_ops(attention, make_batch(few_phrases)) == count_ops(attention, make_batch(many_phrases))


def test_clear_errors():
    padding_mask = torch.ones(2, 5, dtype=torch.bool)
    config = mgsa_config("syntactic")
    attention = PhraseMemoryAttention(config, 4, layer_idx=0)
    with pytest.raises(ValueError, match="phrase_ids"):
        PhraseMemoryInputs.from_syntax(config, MgsaSyntaxInputs(padding_mask=padding_mask))
    with pytest.raises(ValueError, match="levels"):
        PhraseMemoryInputs.from_syntax(
            config, MgsaSyntaxInputs(padding_mask=padding_mask, phrase_ids=torch.zeros(2, 2, 5, dtype=torch.long))
        )
    with pytest.raises(ValueError, match="PhraseMemoryInputs"):
        attention(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="PhraseMemoryInputs"):
        attention(torch.randn(2, 5, 32), syntax=MgsaSyntaxInputs(padding_mask=padding_mask))
    with pytest.raises(ValueError, match="phrase_partition='syntactic'"):
        PhraseMemoryAttention(mgsa_config(phrase_partition="ngram"), 4, layer_idx=0)


# the MG-SA settings of each row of Tables 1-3 (partition, composition, layers, tag supervision, interaction)
TABLE_ROWS = {
    "ngram_max_layers_0-5": ("ngram", "max", [0, 1, 2, 3, 4, 5], False, "none"),
    "ngram_sans_layers_0-5": ("ngram", "sans", [0, 1, 2, 3, 4, 5], False, "none"),
    "ngram_lstm_layers_0-5": ("ngram", "lstm", [0, 1, 2, 3, 4, 5], False, "none"),
    "ngram_sans_layers_0-2": ("ngram", "sans", [0, 1, 2], False, "none"),
    "ngram_sans_layer_0": ("ngram", "sans", [0], False, "none"),  # Table 3 row 2
    "syntactic": ("syntactic", "sans", [0], False, "none"),  # row 3
    "syntactic_tag": ("syntactic", "sans", [0], True, "none"),  # row 4
    "syntactic_tag_lstm": ("syntactic", "sans", [0], True, "lstm"),  # row 5
    "syntactic_tag_on_lstm": ("syntactic", "sans", [0], True, "on_lstm"),  # row 6, "MG-SA" of Table 4
}


def mgsa_settings(config: MgsaConfig) -> tuple:
    return (config.phrase_partition, config.phrase_composition, config.phrase_memory_layers,
            config.phrase_tag_supervision, config.phrase_interaction)


@pytest.mark.parametrize("row", sorted(TABLE_ROWS))
def test_config_files_build_their_rows(row):
    """Each file builds its table row whatever the defaults are: it names every setting that defines the row."""
    config = mgsa_config(row, encoder_layers=6)
    assert mgsa_settings(config) == TABLE_ROWS[row]
    assert (config.phrase_levels, config.phrase_ngram_sizes, config.phrase_tag_loss_weight) == (3, [2, 3, 4], 0.001)
    assert config.phrase_head_allocation() == (1, [1, 1, 1])


@pytest.mark.parametrize("config_class", ["MgsaConfig", "MgsaT5Config"])
def test_default_is_the_papers_final_system(config_class):
    """`encoder_type="phrase_memory"` alone is the paper's "MG-SA" (Table 4; Table 3 row 6): syntactic phrases, tag
    supervision with λ = 0.001, ON-LSTM interaction, SANs composition, bottom layer; the same model as the row's
    file, on both backbones."""
    import mgsa_hf

    cls = getattr(mgsa_hf, config_class)
    sizes = TINY if config_class == "MgsaConfig" else dict(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                           num_decoder_layers=1, num_heads=4, num_phrase_tags=8)
    default = cls(**sizes, encoder_type="phrase_memory")
    row = cls(**sizes, **json.loads((CONFIG_DIR / "syntactic_tag_on_lstm.json").read_text()))
    assert mgsa_settings(default) == TABLE_ROWS["syntactic_tag_on_lstm"]
    assert default.to_diff_dict() == row.to_diff_dict()
    if config_class == "MgsaConfig":
        attention = MgsaForConditionalGeneration(default).get_encoder().layers[0].self_attn
        assert isinstance(attention, PhraseMemoryAttention) and isinstance(attention.interaction, OnLstm)
        assert attention.tag_classifier is not None and type(attention.composition).__name__ == "SansComposition"


def test_default_trains_on_processor_batches(multi30k_processor, multi30k_batch):
    """The default reads the processor's `phrase_ids` and `phrase_tags`: a real batch gives a tag loss and the tag
    classifier a gradient."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(real_config(multi30k_processor)).train()
    output = model(**multi30k_batch)
    assert output.tag_loss is not None and output.tag_loss > 0
    output.loss.backward()
    assert model.get_encoder().layers[0].self_attn.tag_classifier.weight.grad.abs().sum() > 0


def test_saved_ngram_config_keeps_its_function(tmp_path):
    """A config.json saved when the n-gram row was the default (every field written out, as `save_pretrained`
    does) still loads as the n-gram row: no tag classifier, no interaction, and the saved model's outputs."""
    saved = Path(__file__).parent / "data" / "mgsa-ngram-config" / "config.json"
    fields = json.loads(saved.read_text())
    assert (fields["phrase_partition"], fields["phrase_tag_supervision"], fields["phrase_interaction"]) == (
        "ngram", False, "none")
    config = MgsaConfig.from_pretrained(saved.parent)
    assert mgsa_settings(config) == TABLE_ROWS["ngram_sans_layer_0"]
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config).eval()
    attention = model.get_encoder().layers[0].self_attn
    assert attention.tag_classifier is None and attention.interaction is None
    model.save_pretrained(tmp_path)
    reloaded = MgsaForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert mgsa_settings(reloaded.config) == TABLE_ROWS["ngram_sans_layer_0"]
    batch = make_batch(TREES[:2])
    del batch["phrase_ids"], batch["phrase_tags"]  # the n-gram row reads no syntax
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)
