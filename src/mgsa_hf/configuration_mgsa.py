"""MGSA model configurations: a Marian or a T5 configuration plus the syntax-aware encoder and its settings."""

from dataclasses import dataclass

from transformers.models.marian.configuration_marian import MarianConfig
from transformers.models.t5.configuration_t5 import T5Config


ENCODER_TYPES = ("transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe")
PHRASE_PARTITIONS = ("ngram", "syntactic")
PHRASE_COMPOSITIONS = ("max", "mean", "sans", "lstm")
PHRASE_INTERACTIONS = ("none", "lstm", "on_lstm")
PR_SEGMENTATIONS = ("fixed", "parse")
PR_GLANCES = ("max", "mean")
HYBRID_GATES = ("token", "head")
HYBRID_COMBINATIONS = ("gate", "concat", "local")
RHE_ATTENTIONS = ("dea", "lpea")
RHE_MODES = ("rhe", "sea_all", "rhe_prune")
RHE_GATES = ("sigmoid", "confidence", "learned")
RHE_OUT_OF_PHRASE = ("clip", "mask")

# default encoder layers of each encoder-only variant (0 = the bottom layer)
DEFAULT_VARIANT_LAYERS = {"phrase_memory": [0], "hybrid": [0, 1], "rhe": [0]}


@dataclass(kw_only=True, repr=False)
class MgsaVariantConfig:
    r"""
    The syntax-aware encoder settings that both backbones share ([`MgsaConfig`] for Marian, [`MgsaT5Config`] for T5).
    They read the backbone's sizes under Marian's names (`d_model`, `encoder_layers`, `encoder_attention_heads`, ...),
    which [`MgsaT5Config`] maps to T5's.

    Args:
        encoder_type (`str`, defaults to `"transformer"`):
            `"transformer"` (plain Marian), `"phrase_memory"` (MG-SA), `"phrase_representation"` (PR), `"hybrid"`
            (local/global hybrid attention) or `"rhe"` (redundant-head enlivening).
        label_smoothing (`float`, defaults to 0.0):
            Label smoothing ε of the translation loss the model returns with `labels`, as in
            `torch.nn.functional.cross_entropy(label_smoothing=ε)` and the Trainer's `LabelSmoother`; the MG-SA tag
            loss is added to it. 0.0 gives `MarianMTModel`'s (T5's) loss. The papers train with 0.1 (the hybrid paper's
            A.1; Transformer-base, whose setting MG-SA and PR follow): training recipes set it, here or as the
            Trainer's `label_smoothing_factor` (with [`MgsaSeq2SeqTrainer`], which keeps the tag loss).
        phrase_memory_layers (`list[int]`, *optional*, defaults to `[0]`):
            MG-SA: encoder layers whose self-attention is multi-granularity.
        phrase_partition (`str`, defaults to `"syntactic"`):
            MG-SA: `"syntactic"` (the top `phrase_levels` levels of the constituency tree, from the processor) or
            `"ngram"` (non-overlapping n-grams of `phrase_ngram_sizes`, computed in the model).
        phrase_ngram_sizes (`list[int]`, *optional*, defaults to `[2, 3, 4]`):
            MG-SA: n-gram sizes, one granularity each.
        phrase_levels (`int`, defaults to 3):
            Number K of syntactic granularity levels (MG-SA) the processor makes and the model reads.
        phrase_word_heads (`int`, *optional*):
            MG-SA: heads that stay word-level; defaults to a quarter of `encoder_attention_heads`.
        phrase_heads_per_granularity (`list[int]`, *optional*):
            MG-SA: heads given to each granularity; defaults to an even split of the other heads.
        phrase_composition (`str`, defaults to `"sans"`):
            MG-SA: how a phrase's word vectors become one vector: `"max"`, `"mean"`, `"sans"` (the max-pooled vector
            attends inside the phrase) or `"lstm"` (last state).
        phrase_interaction (`str`, defaults to `"on_lstm"`):
            MG-SA: interaction over the phrase sequence: `"none"`, `"lstm"` or `"on_lstm"` (ordered neurons).
        on_lstm_chunk_size (`int`, defaults to 4):
            MG-SA: chunk size of the ON-LSTM master gates (the phrase heads' width must be divisible by it).
        phrase_tag_supervision (`bool`, defaults to `True`):
            MG-SA: predict the tag of each syntactic phrase from its composed vector (needs the syntactic partition).
        phrase_tag_loss_weight (`float`, defaults to 0.001):
            MG-SA: weight λ of the tag loss added to the translation loss (Eq. 12). The tag loss is Eq. 10's sum
            over a sentence's tagged phrases (all levels); Eq. 12 sums both terms per sentence, and as the
            translation loss is a mean over target tokens, the batch's summed tag loss is divided by the same
            target tokens (`modeling_mgsa.tag_loss_per_target_token`).
        num_phrase_tags (`int`, defaults to 64):
            Size of the phrase tag vocabulary (the processor's `PHRASE_TAGS` must fit).

            The MG-SA defaults are the paper's final system, "MG-SA" of its Table 4 (Table 3 row 6: syntactic
            phrases, tag supervision, ON-LSTM interaction, SANs composition, bottom layer);
            `configs/phrase_memory/` names its other rows (the n-gram ones set `phrase_partition="ngram"`,
            `phrase_tag_supervision=False`, `phrase_interaction="none"`).
        pr_segmentation (`str`, defaults to `"fixed"`):
            PR: `"fixed"` phrases of ntok = max(min(`pr_max_phrase_tokens`, len / `pr_length_ratio`),
            `pr_min_phrase_tokens`) tokens, or `"parse"` (Algorithm 1 phrases from the processor).
        pr_max_phrase_tokens (`int`, defaults to 8), pr_min_phrase_tokens (`int`, defaults to 3), pr_length_ratio
        (`int`, defaults to 6):
            PR: the fixed segmentation rule above.
        pr_glance (`str`, defaults to `"max"`):
            PR: glance vector of a phrase: `"max"` or `"mean"` pooling.
        pr_attentive (`bool`, defaults to `True`):
            PR: attentive phrase representation (else the glance vector itself is the phrase vector).
        pr_transparent_attention (`bool`, defaults to `True`):
            PR: decoder layers attend to a learned mix of all encoder layers' phrases (else to the last layer's).
        pr_combination_dim (`int`, *optional*):
            PR: hidden size of the attentive combination's 2-layer network (W3, W4 of the paper's Eq. 8, which leaves
            it open); defaults to `3 * d_model`, the width at which Transformer-base's "+Max" row has Table 2's
            parameter count (+40.9M; +37.7M here). `configs/phrase_representation/max_attn_ta_narrow.json` names a
            cheaper 256-wide network (`d_model // 2` at base size).
        pr_pooling_dim (`int`, *optional*):
            PR: hidden size of the attentive pooling's scoring network (W1 of the paper's Eq. 3, which leaves it
            open); defaults to `12 * d_model`, the width at which Transformer-base's "+Max+Attn" rows add Table 2's
            +44.0M over "+Max" (7 poolings of 12 × 512 = 6144 units). A PR config saved before this field existed
            loads with `d_model`, the width it was built with. `configs/phrase_representation/max_attn_ta_narrow*.json`
            name cheaper widths.
        pr_centred_sigmoid (`bool`, defaults to `True`):
            PR: Eq. 8 as W4 (σ(h) − ½) + b4, the same functions as the paper's W4 σ(h) + b4 (½ W4 1 moves into b4) but
            without a common-mode direction that Adam grows fast (see `AttentivePhraseCombination`); `False` computes
            Eq. 8 as written, which a PR config saved before this field existed loads with (the function it was
            trained with).
        hybrid_layers (`list[int]`, *optional*, defaults to `[0, 1]`):
            Hybrid: encoder layers with local/global hybrid attention.
        hybrid_window (`int`, defaults to 1):
            Hybrid: local window m, positions with |i - j| <= m.
        hybrid_gate (`str`, defaults to `"token"`):
            Hybrid: one gate per token (`"token"`) or per token and head (`"head"`).
        hybrid_combination (`str`, defaults to `"gate"`):
            Hybrid: `"gate"` (gated sum), `"concat"` (the paper's concatenation ablation) or `"local"` (the local
            pattern alone, Table 1's "+LOCAL PATTERN" row: no new parameters).
        rhe_layers (`list[int]`, *optional*, defaults to `[0]`):
            RHE: encoder layers with syntax-enhanced attention.
        rhe_attention (`str`, defaults to `"lpea"`):
            RHE: the syntax-enhanced attention, `"dea"` (dependency mask) or `"lpea"` (local-phrase bias).
        rhe_mode (`str`, defaults to `"rhe"`):
            RHE: `"sea_all"` (every head uses the syntax-enhanced attention), `"rhe"` (redundant heads do) or
            `"rhe_prune"` (redundant heads are zeroed).
        rhe_max_relative_position (`int`, defaults to 6):
            RHE: clipping distance k of relative local-phrasal positions.
        rhe_out_of_phrase (`str`, defaults to `"clip"`):
            RHE LPEA: word pairs outside one local phrase have relative position ∞, which Eq. 7's clip turns into k,
            so they attend with the learned w_k (`"clip"`, the paper's); `"mask"` drops those pairs instead.
        rhe_gate (`str`, defaults to `"confidence"`):
            RHE: the Syn_gate a head's Syn_attn must exceed to count as important: `"confidence"` (h_conf, the
            criterion the paper's prose states beside Eq. 10), `"sigmoid"` (σ(h_conf), Eq. 10 as printed: σ(h_conf)
            > 0.5, so a trained CPU-recipe model labels 100% of its heads redundant and RHE acts as SEA on every
            head) or `"learned"` (σ(w_h h_conf + b_h), w and b trained per head through a straight-through
            estimator). `configs/rhe/README.md` gives the share of heads each labels redundant, before and after
            training. A saved config without the field (trained before it existed) loads with `"sigmoid"`.
        rhe_fixed_gate (`float`, *optional*):
            RHE: a fixed Syn_gate instead of `rhe_gate`'s (not with `"learned"`).
    """

    # the backbone's attention layout (`modeling_layers.ATTENTION_LAYOUTS`) and the model_type its checkpoints carry
    backbone = "marian"
    source_model_type = "marian"

    encoder_type: str = "transformer"
    label_smoothing: float = 0.0
    # MG-SA (phrase_memory)
    phrase_memory_layers: list[int] | None = None
    phrase_partition: str = "syntactic"
    phrase_ngram_sizes: list[int] | None = None
    phrase_levels: int = 3
    phrase_word_heads: int | None = None
    phrase_heads_per_granularity: list[int] | None = None
    phrase_composition: str = "sans"
    phrase_interaction: str = "on_lstm"
    on_lstm_chunk_size: int = 4
    phrase_tag_supervision: bool = True
    phrase_tag_loss_weight: float = 0.001
    num_phrase_tags: int = 64
    # PR (phrase_representation)
    pr_segmentation: str = "fixed"
    pr_max_phrase_tokens: int = 8
    pr_min_phrase_tokens: int = 3
    pr_length_ratio: int = 6
    pr_glance: str = "max"
    pr_attentive: bool = True
    pr_transparent_attention: bool = True
    pr_combination_dim: int | None = None
    pr_pooling_dim: int | None = None
    pr_centred_sigmoid: bool = True
    # hybrid
    hybrid_layers: list[int] | None = None
    hybrid_window: int = 1
    hybrid_gate: str = "token"
    hybrid_combination: str = "gate"
    # RHE
    rhe_layers: list[int] | None = None
    rhe_attention: str = "lpea"
    rhe_mode: str = "rhe"
    rhe_max_relative_position: int = 6
    rhe_out_of_phrase: str = "clip"
    rhe_fixed_gate: float | None = None
    rhe_gate: str = "confidence"

    def __post_init__(self, **kwargs):
        for variant, layers in DEFAULT_VARIANT_LAYERS.items():
            if getattr(self, f"{variant}_layers") is None:
                setattr(self, f"{variant}_layers", [layer for layer in layers if layer < self.encoder_layers])
        if self.phrase_ngram_sizes is None:
            self.phrase_ngram_sizes = [2, 3, 4]
        super().__post_init__(**kwargs)
        self._validate_backbone()
        self._validate_choices()
        self._validate_sizes()
        self._validate_phrase_heads()
        self._validate_loss()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Read an MGSA `config.json` or the backbone's own (Marian/opus-mt, T5): every backbone field is ours too."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.source_model_type:
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """A config from a dict; a saved MGSA config that predates a field whose default changed the function gets
        the value it was built with."""
        if "pr_attentive" in config_dict:  # written by this package: every field it had is there
            legacy_values = {"pr_pooling_dim": config_dict.get("d_model"), "pr_centred_sigmoid": False,
                             "rhe_gate": "sigmoid"}
            config_dict = {**legacy_values, **config_dict}
        return super().from_dict(config_dict, **kwargs)

    @property
    def variant_layers(self) -> list[int]:
        """Encoder layers whose self-attention the chosen encoder-only variant replaces (empty otherwise)."""
        if self.encoder_type in DEFAULT_VARIANT_LAYERS:
            return list(getattr(self, f"{self.encoder_type}_layers"))
        return []

    @property
    def num_phrase_granularities(self) -> int:
        """Number of MG-SA phrase granularities (n-gram sizes or syntactic levels)."""
        return len(self.phrase_ngram_sizes) if self.phrase_partition == "ngram" else self.phrase_levels

    def phrase_head_allocation(self) -> tuple[int, list[int]]:
        """MG-SA heads as `(word_heads, heads_per_granularity)`."""
        heads = self.encoder_attention_heads
        word_heads = heads // 4 if self.phrase_word_heads is None else self.phrase_word_heads
        per_granularity = self.phrase_heads_per_granularity
        if per_granularity is None:
            share, extra = divmod(heads - word_heads, self.num_phrase_granularities)
            per_granularity = [share + (g < extra) for g in range(self.num_phrase_granularities)]
        return word_heads, list(per_granularity)

    def phrase_head_width(self) -> int:
        """MG-SA's d_m = (phrase heads) × d_h (T5's `d_kv`, else d_model / heads): the width of the head-space phrase
        memory, 384 at Transformer-base."""
        word_heads, _ = self.phrase_head_allocation()
        head_dim = getattr(self, "d_kv", None) or self.d_model // self.encoder_attention_heads
        return (self.encoder_attention_heads - word_heads) * head_dim

    @property
    def variant_init_std(self) -> float:
        """Standard deviation of the variants' own weight matrices, the backbone's (see the subclasses)."""
        raise NotImplementedError

    def _validate_backbone(self):
        """Backbone-specific size checks."""

    def _validate_choices(self):
        choices = {
            "encoder_type": ENCODER_TYPES,
            "phrase_partition": PHRASE_PARTITIONS,
            "phrase_composition": PHRASE_COMPOSITIONS,
            "phrase_interaction": PHRASE_INTERACTIONS,
            "pr_segmentation": PR_SEGMENTATIONS,
            "pr_glance": PR_GLANCES,
            "hybrid_gate": HYBRID_GATES,
            "hybrid_combination": HYBRID_COMBINATIONS,
            "rhe_attention": RHE_ATTENTIONS,
            "rhe_mode": RHE_MODES,
            "rhe_gate": RHE_GATES,
            "rhe_out_of_phrase": RHE_OUT_OF_PHRASE,
        }
        for field, allowed in choices.items():
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"`{field}` must be one of {allowed}, got {value!r}.")

    def _validate_sizes(self):
        if self.encoder_type in DEFAULT_VARIANT_LAYERS:
            field = f"{self.encoder_type}_layers"
            layers = getattr(self, field)
            if not layers or any(not 0 <= layer < self.encoder_layers for layer in layers):
                raise ValueError(
                    f"`{field}` must be a non-empty list of encoder layer indices in [0, {self.encoder_layers}), "
                    f"got {layers!r}."
                )
        positive = {
            "phrase_levels": self.phrase_levels,
            "on_lstm_chunk_size": self.on_lstm_chunk_size,
            "num_phrase_tags": self.num_phrase_tags,
            "pr_max_phrase_tokens": self.pr_max_phrase_tokens,
            "pr_min_phrase_tokens": self.pr_min_phrase_tokens,
            "pr_length_ratio": self.pr_length_ratio,
            "hybrid_window": self.hybrid_window,
        }
        for field, value in positive.items():
            if value < 1:
                raise ValueError(f"`{field}` must be a positive integer, got {value!r}.")
        if self.pr_min_phrase_tokens > self.pr_max_phrase_tokens:
            raise ValueError(
                f"`pr_min_phrase_tokens` ({self.pr_min_phrase_tokens}) must not exceed `pr_max_phrase_tokens` "
                f"({self.pr_max_phrase_tokens})."
            )
        for field in ("pr_combination_dim", "pr_pooling_dim"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"`{field}` must be a positive integer or None, got {value!r}.")
        if not self.phrase_ngram_sizes or any(size < 1 for size in self.phrase_ngram_sizes):
            raise ValueError(
                f"`phrase_ngram_sizes` must be a non-empty list of sizes >= 1, got {self.phrase_ngram_sizes!r}."
            )
        if self.rhe_max_relative_position < 0:
            raise ValueError(f"`rhe_max_relative_position` must be >= 0, got {self.rhe_max_relative_position!r}.")
        if self.rhe_fixed_gate is not None and not 0.0 <= self.rhe_fixed_gate <= 1.0:
            raise ValueError(f"`rhe_fixed_gate` must be in [0, 1] or None, got {self.rhe_fixed_gate!r}.")
        if self.rhe_fixed_gate is not None and self.rhe_gate == "learned":
            raise ValueError('`rhe_fixed_gate` fixes the gate that `rhe_gate="learned"` learns: set one of the two.')
        if self.phrase_tag_loss_weight < 0:
            raise ValueError(f"`phrase_tag_loss_weight` must be >= 0, got {self.phrase_tag_loss_weight!r}.")

    def _validate_loss(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1), got {self.label_smoothing!r}.")

    def _validate_phrase_heads(self):
        heads = self.encoder_attention_heads
        word_heads, per_granularity = self.phrase_head_allocation()
        if not 0 <= word_heads < heads:
            raise ValueError(f"`phrase_word_heads` must be in [0, {heads}), got {word_heads!r}.")
        if len(per_granularity) != self.num_phrase_granularities or any(h < 0 for h in per_granularity):
            raise ValueError(
                f"`phrase_heads_per_granularity` must list a non-negative head count for each of the "
                f"{self.num_phrase_granularities} granularities, got {per_granularity!r}."
            )
        if word_heads + sum(per_granularity) != heads:
            raise ValueError(
                f"`phrase_word_heads` ({word_heads}) + `phrase_heads_per_granularity` ({per_granularity}) must add up "
                f"to `encoder_attention_heads` ({heads})."
            )
        phrase_width = self.phrase_head_width()
        if self.encoder_type == "phrase_memory" and self.phrase_interaction == "on_lstm" and (
            phrase_width % self.on_lstm_chunk_size
        ):
            raise ValueError(
                f"The ON-LSTM interaction is as wide as the {heads - word_heads} phrase heads ({phrase_width}), "
                f"which `on_lstm_chunk_size` ({self.on_lstm_chunk_size}) must divide."
            )


class MgsaConfig(MgsaVariantConfig, MarianConfig):
    r"""
    Configuration of [`MgsaModel`] / [`MgsaForConditionalGeneration`]: every [`~transformers.MarianConfig`] field
    (so an opus-mt style `config.json` loads as is) plus the syntax-aware encoder of [`MgsaVariantConfig`].
    """

    model_type = "mgsa"

    @property
    def variant_init_std(self) -> float:
        """Marian's `init_std`."""
        return self.init_std

    def _validate_backbone(self):
        for field, heads in (("encoder_attention_heads", self.encoder_attention_heads),
                             ("decoder_attention_heads", self.decoder_attention_heads)):
            if heads <= 0 or self.d_model % heads:
                raise ValueError(f"`{field}` ({heads}) must be a positive divisor of `d_model` ({self.d_model}).")


class MgsaT5Config(MgsaVariantConfig, T5Config):
    r"""
    Configuration of [`MgsaT5Model`] / [`MgsaT5ForConditionalGeneration`]: every [`~transformers.T5Config`] field (so
    a T5 or T5 v1.1 `config.json` loads as is) plus the syntax-aware encoder of [`MgsaVariantConfig`], whose fields
    mean the same as in [`MgsaConfig`]. Marian's size names read T5's: `encoder_layers` is `num_layers`,
    `encoder_attention_heads` is `num_heads`, `dropout` and `attention_dropout` are `dropout_rate`.
    """

    model_type = "mgsa_t5"
    backbone = "t5"
    source_model_type = "t5"
    attribute_map = {
        **T5Config.attribute_map,
        "encoder_layers": "num_layers",
        "decoder_layers": "num_decoder_layers",
        "encoder_attention_heads": "num_heads",
        "decoder_attention_heads": "num_heads",
        "encoder_ffn_dim": "d_ff",
        "decoder_ffn_dim": "d_ff",
        "dropout": "dropout_rate",
        "attention_dropout": "dropout_rate",
    }

    @property
    def variant_init_std(self) -> float:
        """T5's scale for a matrix reading d_model inputs: `initializer_factor` / √d_model."""
        return self.initializer_factor * self.d_model**-0.5

    def _validate_backbone(self):
        if self.num_heads <= 0 or self.d_kv <= 0:
            raise ValueError(f"`num_heads` ({self.num_heads}) and `d_kv` ({self.d_kv}) must be positive.")


__all__ = ["MgsaConfig", "MgsaT5Config", "MgsaVariantConfig"]
