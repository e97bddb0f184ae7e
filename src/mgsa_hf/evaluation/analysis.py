"""Analyses of trained models over a data set: the hybrid gates per layer and universal part-of-speech tag (the hybrid
paper's Figures 3 and 4) and the share of heads RHE labels redundant (Eq. 10), through the processor or on a
benchmark run's prepared batches."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..modeling_syntax_inputs import SYNTAX_INPUT_NAMES
from ..training.prepared import Recipe, build_model, scored_checkpoints
from . import average_checkpoints


# Hybrid gates (the hybrid paper's Figures 3 and 4)

# the universal part-of-speech tags of the paper's Figure 4 (Petrov et al., 2012), in its order; "SYM" is the
# tagset's "." (punctuation and symbols)
UNIVERSAL_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "CONJ", "PRON", "DET", "PRT", "ADP", "NUM", "SYM", "X")
# Penn Treebank part-of-speech tag -> universal tag (Petrov et al.'s en-ptb mapping, plus spaCy's extra PTB tags);
# tags not listed map to "X"
PTB_TO_UNIVERSAL = {
    **dict.fromkeys(("NN", "NNS", "NNP", "NNPS"), "NOUN"),
    **dict.fromkeys(("VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "MD"), "VERB"),
    **dict.fromkeys(("JJ", "JJR", "JJS"), "ADJ"),
    **dict.fromkeys(("RB", "RBR", "RBS", "WRB"), "ADV"),
    "CC": "CONJ",
    **dict.fromkeys(("PRP", "PRP$", "WP", "WP$"), "PRON"),
    **dict.fromkeys(("DT", "PDT", "WDT", "EX"), "DET"),
    **dict.fromkeys(("POS", "RP", "TO"), "PRT"),
    "IN": "ADP",
    "CD": "NUM",
    **dict.fromkeys(
        (".", ",", ":", "``", "''", "-LRB-", "-RRB-", "#", "$", "!", "?", "(", ")", "HYPH", "NFP"), "SYM"
    ),
}


def encoder_outputs(model, processor, texts: list[str], batch_size: int = 32):
    """Yield `(texts, encoder inputs, encoder output)` for `texts` in batches of `batch_size`, without gradients.
    `processor` is an [`MgsaProcessor`] (or anything that turns texts into the encoder's inputs)."""
    encoder = model.get_encoder()
    names = ("input_ids", "attention_mask", *SYNTAX_INPUT_NAMES)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            batch = processor(chunk, return_tensors="pt")
            inputs = {name: batch[name].to(model.device) for name in names if batch.get(name) is not None}
            yield chunk, inputs, encoder(**inputs)


@dataclass
class GateStatistics:
    """
    Sums of the hybrid gates g_i (Eq. 5) over the word tokens of a data set, per hybrid layer and per universal POS
    tag of the token's word (per-head gates are averaged over heads; subword tokens count one each; EOS and padding
    are left out).

    Attributes:
        layers: the hybrid layers, in the order of the model's `encoder_gates`.
        gate_sums: (len(layers), len(UNIVERSAL_TAGS)) sum of the gates of the tokens with each tag.
        token_counts: (len(UNIVERSAL_TAGS),) number of those tokens.
    """

    layers: list[int]
    gate_sums: torch.Tensor
    token_counts: torch.Tensor

    @classmethod
    def empty(cls, layers: list[int]) -> "GateStatistics":
        """Statistics with nothing counted yet, for the hybrid layers `layers`."""
        return cls(list(layers), torch.zeros(len(layers), len(UNIVERSAL_TAGS)), torch.zeros(len(UNIVERSAL_TAGS)))

    def update(self, gates: tuple[torch.Tensor, ...], word_ids: torch.LongTensor, word_tags: list[list[str]]):
        """
        Args:
            gates: one (B, L) or (B, H, L) tensor per hybrid layer (the model's `encoder_gates`).
            word_ids: (B, L) word index of each token (`MgsaProcessor`'s `word_ids`).
            word_tags: per sentence, the universal tag of each word.
        """
        gates = torch.stack([gate.mean(1) if gate.dim() == 3 else gate for gate in gates]).float().cpu()
        tag_index = {tag: i for i, tag in enumerate(UNIVERSAL_TAGS)}
        tokens = torch.full(word_ids.shape, -1, dtype=torch.long)
        for row, tags in enumerate(word_tags):
            ids = word_ids[row].cpu()
            table = torch.tensor([tag_index[tag] for tag in tags] + [-1], dtype=torch.long)
            is_word = (ids >= 0) & (ids < len(tags))
            tokens[row] = torch.where(is_word, table[ids.clamp(0, len(tags))], -1)
        counted = tokens >= 0
        one_hot = nn.functional.one_hot(tokens[counted], len(UNIVERSAL_TAGS)).float()  # (tokens, tags)
        self.gate_sums += gates[:, counted] @ one_hot
        self.token_counts += one_hot.sum(0)

    def layer_means(self) -> dict[int, float]:
        """Mean gate per hybrid layer over all word tokens (Figure 3)."""
        means = self.gate_sums.sum(1) / self.token_counts.sum().clamp(min=1)
        return dict(zip(self.layers, means.tolist(), strict=True))

    def tag_means(self, layer: int | None = None) -> dict[str, float]:
        """Mean gate per universal tag seen in the data, at `layer` (default: the lowest hybrid layer; Figure 4)."""
        row = self.layers.index(self.layers[0] if layer is None else layer)
        return {
            tag: (self.gate_sums[row, i] / self.token_counts[i]).item()
            for i, tag in enumerate(UNIVERSAL_TAGS)
            if self.token_counts[i] > 0
        }


def word_universal_tags(syntax) -> list[str]:
    """Universal tag of each word of a [`SentenceSyntax`]: the PTB tag of its leaf in the constituency tree."""
    tree = syntax.tree
    return [PTB_TO_UNIVERSAL.get(tree.label[path[-1]], "X") for path in tree.paths]


def hybrid_gate_statistics(model, processor, texts: list[str], batch_size: int = 32) -> GateStatistics:
    """
    Mean hybrid gate per layer and per universal POS tag over `texts` (the paper's Figures 3 and 4).

    Args:
        model: an [`MgsaForConditionalGeneration`] (or [`MgsaModel`]) with `encoder_type="hybrid"` and the gate
            combination.
        processor: the [`MgsaProcessor`] that makes the model's inputs; `processor.syntax(text)` gives the words
            and their PTB tags (the leaves of the constituency tree).
    """
    if model.config.encoder_type != "hybrid" or model.config.hybrid_combination != "gate":
        raise ValueError('Gate statistics need a model with encoder_type="hybrid" and hybrid_combination="gate".')
    statistics = GateStatistics.empty(model.config.hybrid_layers)
    for chunk, inputs, output in encoder_outputs(model, processor, texts, batch_size):
        tags = [word_universal_tags(processor.syntax(text)) for text in chunk]
        statistics.update(output.gates, inputs["word_ids"], tags)
    return statistics


def plot_gate_statistics(statistics: GateStatistics, path, layer: int | None = None) -> None:
    """Bar charts of the mean gate per layer (Figure 3) and per universal tag at `layer` (Figure 4), saved to `path`
    (PNG). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError as error:
        raise ImportError("plot_gate_statistics needs matplotlib: `pip install matplotlib`.") from error
    layer_means, tag_means = statistics.layer_means(), statistics.tag_means(layer)
    figure, (by_layer, by_tag) = pyplot.subplots(1, 2, figsize=(11, 3.5), width_ratios=(1, 3))
    by_layer.bar([str(index + 1) for index in layer_means], list(layer_means.values()))
    by_layer.set(xlabel="encoder layer", ylabel="mean local weight g", title="Gate per layer")
    by_tag.bar(list(tag_means), list(tag_means.values()))
    shown = statistics.layers[0] if layer is None else layer
    by_tag.set(xlabel="universal POS", ylabel="mean local weight g", title=f"Gate per POS, layer {shown + 1}")
    figure.tight_layout()
    figure.savefig(path, format="png")
    pyplot.close(figure)


# RHE's redundant heads


@dataclass
class RedundantHeadRate:
    """
    How often each head of each RHE layer was labelled redundant (Eq. 10) over a data set.

    Attributes:
        layers: the RHE layers, in the order of the model's `encoder_head_labels`.
        rate: (len(layers), heads) fraction of sentences in which the head was redundant.
        sentences: the number of sentences.
    """

    layers: list[int]
    rate: torch.Tensor
    sentences: int

    def format(self) -> str:
        """A plain-text table: one row per layer, one column per head, the redundant rate in percent."""
        heads = self.rate.shape[1]
        lines = ["layer  " + " ".join(f"h{head:<5}" for head in range(heads)) + " mean"]
        for layer, rates in zip(self.layers, self.rate.tolist(), strict=True):
            cells = " ".join(f"{100 * rate:5.1f}%" for rate in rates)
            lines.append(f"{layer:<6} {cells} {100 * sum(rates) / heads:5.1f}%")
        return "\n".join(lines)


def redundant_head_rate(model, processor, texts: list[str], batch_size: int = 32) -> RedundantHeadRate:
    """
    The redundant-head rate per RHE layer and head over `texts`.

    Args:
        model: an [`MgsaForConditionalGeneration`] (or [`MgsaModel`]) with `encoder_type="rhe"` and `rhe_mode`
            `"rhe"` or `"rhe_prune"` (the modes that identify heads).
        processor: the [`MgsaProcessor`] that makes the model's inputs.
    """
    config = model.config
    if config.encoder_type != "rhe" or config.rhe_mode == "sea_all":
        raise ValueError('Head labels need a model with encoder_type="rhe" and rhe_mode "rhe" or "rhe_prune".')
    redundant, sentences = torch.zeros(len(config.rhe_layers), config.encoder_attention_heads), 0
    for chunk, _, output in encoder_outputs(model, processor, texts, batch_size):
        redundant += torch.stack([(labels == 0).sum(0) for labels in output.head_labels]).float().cpu()
        sentences += len(chunk)
    return RedundantHeadRate(list(config.rhe_layers), redundant / max(sentences, 1), sentences)


def load_prepared_run(run_dir: Path, corpus, initial: bool = False):
    """`(model in eval mode, names of the averaged checkpoints)` of an RHE run of the quality benchmark
    (`benchmarking.quality`); with `initial`,
    the run's model as it was built, before training (checkpoints `["initialisation"]`)."""
    run = json.loads((run_dir / "run.json").read_text())
    if run["row"].get("encoder_type") != "rhe":
        raise SystemExit(f"{run_dir}: not an RHE run (row {run['row']})")
    recipe = Recipe(**run["recipe"])
    model = build_model(corpus, recipe, run["row"], run["seed"])
    if initial:
        return model.eval(), ["initialisation"]
    checkpoints = scored_checkpoints(run_dir, recipe)
    if not checkpoints:
        raise SystemExit(f"{run_dir}: no checkpoint up to step {recipe.max_steps}")
    model.load_state_dict(average_checkpoints(checkpoints))
    return model.eval(), [path.stem for path in checkpoints]


def prepared_run_head_rate(run_dir: Path, corpus, split_name: str, batch_size: int, initial: bool = False) -> dict:
    """`{"row", "checkpoints", "sentences", "layers", "redundant": [[rate per head] per RHE layer]}` for one run,
    counted on the prepared batches (the same fields as [`redundant_head_rate`] gets from the processor)."""
    model, checkpoints = load_prepared_run(run_dir, corpus, initial)
    split = corpus.split(split_name)
    redundant = torch.zeros(len(model.config.rhe_layers), model.config.encoder_attention_heads)
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            batch = split.batch(range(start, min(start + batch_size, len(split))), with_labels=False)
            output = model.get_encoder()(**batch)
            redundant += torch.stack([(labels == 0).sum(0) for labels in output.head_labels]).float()
    row = json.loads((run_dir / "run.json").read_text())["row"]
    return {"row": row, "checkpoints": checkpoints, "sentences": len(split),
            "layers": list(model.config.rhe_layers), "redundant": (redundant / len(split)).round(decimals=4).tolist()}
