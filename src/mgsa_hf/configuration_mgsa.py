"""MGSA model configurations: a Marian or a T5 configuration plus the syntax-aware encoder and its settings."""

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Literal

from huggingface_hub.dataclasses import strict, validated_field
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
# unknown keyword arguments with these prefixes are taken for misspelt variant fields (backbone configs carry legacy
# keys of their own, which load as transformers loads them)
VARIANT_FIELD_PREFIXES = ("phrase_", "pr_", "hybrid_", "rhe_", "on_lstm_", "num_phrase_")
# keyword arguments that `PretrainedConfig.from_dict` itself handles
_FROM_DICT_OWN_KEYS = {"dtype", "torch_dtype", "num_labels", "attn_implementation", "experts_implementation",
                       "output_attentions", "name_or_path"}


# Field validators (`huggingface_hub.dataclasses.strict` runs each on construction and on every assignment, after the
# check of the field's type; its error names the field).
def _refuse_bool(value):
    # `True` is an `int` to Python: huggingface_hub >= 2 refuses it for an `int`/`float` field, 1.x lets it through
    if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(item, bool) for item in value)):
        raise TypeError(f"expected a number, got {value!r}.")


def _at_least(minimum: float):
    def check(value):
        _refuse_bool(value)
        if value is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value!r}.")

    return check


def _in_unit_interval(value):
    _refuse_bool(value)
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"must be in [0, 1], got {value!r}.")


def _smoothing(value):
    _refuse_bool(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1), got {value!r}.")


def _items_at_least(minimum: int, non_empty: bool = True):
    def check(value):
        if value is None:
            return
        _refuse_bool(value)
        if non_empty and not value:
            raise ValueError("must not be empty.")
        if any(item < minimum for item in value):
            raise ValueError(f"every entry must be >= {minimum}, got {value!r}.")

    return check


def _field(default, *validators):
    return validated_field(list(validators), default=default)


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

    encoder_type: Literal[ENCODER_TYPES] = "transformer"
    label_smoothing: float | int = _field(0.0, _smoothing)
    # MG-SA (phrase_memory)
    phrase_memory_layers: list[int] | None = _field(None, _items_at_least(0, non_empty=False))
    phrase_partition: Literal[PHRASE_PARTITIONS] = "syntactic"
    phrase_ngram_sizes: list[int] | None = _field(None, _items_at_least(1))
    phrase_levels: int = _field(3, _at_least(1))
    phrase_word_heads: int | None = _field(None, _at_least(0))
    phrase_heads_per_granularity: list[int] | None = _field(None, _items_at_least(0))
    phrase_composition: Literal[PHRASE_COMPOSITIONS] = "sans"
    phrase_interaction: Literal[PHRASE_INTERACTIONS] = "on_lstm"
    on_lstm_chunk_size: int = _field(4, _at_least(1))
    phrase_tag_supervision: bool = True
    phrase_tag_loss_weight: float | int = _field(0.001, _at_least(0))
    num_phrase_tags: int = _field(64, _at_least(1))
    # PR (phrase_representation)
    pr_segmentation: Literal[PR_SEGMENTATIONS] = "fixed"
    pr_max_phrase_tokens: int = _field(8, _at_least(1))
    pr_min_phrase_tokens: int = _field(3, _at_least(1))
    pr_length_ratio: int = _field(6, _at_least(1))
    pr_glance: Literal[PR_GLANCES] = "max"
    pr_attentive: bool = True
    pr_transparent_attention: bool = True
    pr_combination_dim: int | None = _field(None, _at_least(1))
    pr_pooling_dim: int | None = _field(None, _at_least(1))
    pr_centred_sigmoid: bool = True
    # hybrid
    hybrid_layers: list[int] | None = _field(None, _items_at_least(0, non_empty=False))
    hybrid_window: int = _field(1, _at_least(1))
    hybrid_gate: Literal[HYBRID_GATES] = "token"
    hybrid_combination: Literal[HYBRID_COMBINATIONS] = "gate"
    # RHE
    rhe_layers: list[int] | None = _field(None, _items_at_least(0, non_empty=False))
    rhe_attention: Literal[RHE_ATTENTIONS] = "lpea"
    rhe_mode: Literal[RHE_MODES] = "rhe"
    rhe_max_relative_position: int = _field(6, _at_least(0))
    rhe_out_of_phrase: Literal[RHE_OUT_OF_PHRASE] = "clip"
    rhe_fixed_gate: float | int | None = _field(None, _in_unit_interval)
    rhe_gate: Literal[RHE_GATES] = "confidence"

    def __post_init__(self, **kwargs):
        self.reject_unknown_fields(kwargs, only_variant_like=True)
        for variant, layers in DEFAULT_VARIANT_LAYERS.items():
            if getattr(self, f"{variant}_layers") is None:
                # the default layers the encoder has (at least the bottom one: a 0-layer encoder fails its own check)
                setattr(self, f"{variant}_layers", [layer for layer in layers if layer < self.encoder_layers] or [0])
        if self.phrase_ngram_sizes is None:
            self.phrase_ngram_sizes = [2, 3, 4]
        super().__post_init__(**kwargs)
        # the `validate_*` methods run after this, on construction (`@strict` on each config class) and on saving

    @classmethod
    def field_names(cls) -> set[str]:
        """Every name the config takes: its fields, the backbone's aliases (`attribute_map`) and the attributes the
        backbone sets itself (T5's `tie_word_embeddings`, `is_gated_act`, ...)."""
        if "_field_names" not in cls.__dict__:
            cls._field_names = frozenset(
                {field.name for field in dataclasses.fields(cls)} | set(cls.attribute_map) | set(cls().to_dict())
            )
        return cls._field_names

    @classmethod
    def reject_unknown_fields(cls, names, only_variant_like: bool = False):
        """
        Raise a `ValueError` naming each of `names` that is not a field of the config, with the nearest field name.

        Args:
            names (`Iterable[str]`): the keys to check (keyword arguments, a CLI's `model.*` keys, a `--set`).
            only_variant_like (`bool`): check only the names that look like a variant field (a variant prefix, or
                close to a variant field's name). Backbone `config.json` files carry keys that are no field (opus-mt
                ones have `static_position_embeddings`, `num_beams`, ...), which transformers keeps as attributes.
        """
        names = list(names)
        if not names:
            return
        known = cls.field_names()
        variant_fields = [field.name for field in dataclasses.fields(MgsaVariantConfig)]
        unknown = []
        for name in names:
            if name in known or name.startswith("_"):
                continue
            looks_like_variant = name.startswith(VARIANT_FIELD_PREFIXES) or difflib.get_close_matches(
                name, variant_fields, n=1, cutoff=0.8
            )
            if only_variant_like and not looks_like_variant:
                continue
            nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            unknown.append(f"`{name}`" + (f" (did you mean `{nearest[0]}`?)" if nearest else ""))
        if unknown:
            raise ValueError(f"{cls.__name__} has no field {', '.join(unknown)}; see its docstring for the fields.")

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Read an MGSA `config.json` or the backbone's own (Marian/opus-mt, T5): every backbone field is ours too."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.source_model_type:
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """
        A config from a dict (a `config.json`) and keyword arguments (`from_pretrained(path, encoder_type="rhe")`).

        The keyword arguments that name fields join the dict, so that the config is validated as a whole: transformers
        would set them one by one after construction, past the checks that relate fields (layer indices within the
        model, heads that add up). A saved MGSA config that predates a field whose default changed the function gets
        the value it was built with.
        """
        if "pr_attentive" in config_dict:  # written by this package: every field it had is there
            legacy_values = {"pr_pooling_dim": config_dict.get("d_model"), "pr_centred_sigmoid": False,
                             "rhe_gate": "sigmoid"}
            config_dict = {**legacy_values, **config_dict}
        config_dict = dict(config_dict)
        for name in [name for name in kwargs if name in cls.field_names() and name not in _FROM_DICT_OWN_KEYS]:
            config_dict[cls.attribute_map.get(name, name)] = kwargs.pop(name)
        cls.reject_unknown_fields([name for name in kwargs if name != "return_unused_kwargs"], only_variant_like=True)
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

    # Class validators: `@strict` runs every `validate_*` method after construction and before saving; a field's own
    # type and range are checked by its field validator (see the field declarations).
    def validate_backbone_sizes(self):
        """The backbone's sizes are positive (subclasses check how the heads divide the width)."""
        for field in ("vocab_size", "d_model", "max_position_embeddings", "encoder_layers", "decoder_layers",
                      "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads", "decoder_attention_heads"):
            value = getattr(self, field, None)
            if isinstance(value, int) and (isinstance(value, bool) or value < 1):
                name = self.attribute_map.get(field, field)  # T5's own name
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")

    def validate_variant_layers(self):
        """Each variant's layer indices lie within the encoder."""
        for variant in DEFAULT_VARIANT_LAYERS:
            field = f"{variant}_layers"
            layers = getattr(self, field)
            if self.encoder_type == variant and not layers:
                raise ValueError(f"`{field}` must name at least one encoder layer for encoder_type={variant!r}.")
            outside = [layer for layer in layers if not 0 <= layer < self.encoder_layers]
            if outside:
                raise ValueError(
                    f"`{field}` {layers!r} names layers {outside} outside the encoder's {self.encoder_layers} layers "
                    f"(indices 0 to {self.encoder_layers - 1})."
                )

    def validate_variant_settings(self):
        """Settings that relate two fields."""
        if self.pr_min_phrase_tokens > self.pr_max_phrase_tokens:
            raise ValueError(
                f"`pr_min_phrase_tokens` ({self.pr_min_phrase_tokens}) must not exceed `pr_max_phrase_tokens` "
                f"({self.pr_max_phrase_tokens})."
            )
        if self.rhe_fixed_gate is not None and self.rhe_gate == "learned":
            raise ValueError('`rhe_fixed_gate` fixes the gate that `rhe_gate="learned"` learns: set one of the two.')

    def validate_phrase_heads(self):
        """MG-SA's heads add up to the encoder's, and the ON-LSTM chunks divide the phrase heads' width."""
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


@strict
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

    def validate_heads_divide_width(self):
        for field, heads in (("encoder_attention_heads", self.encoder_attention_heads),
                             ("decoder_attention_heads", self.decoder_attention_heads)):
            if self.d_model % heads:
                raise ValueError(f"`{field}` ({heads}) must be a positive divisor of `d_model` ({self.d_model}).")


@strict
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

    def validate_backbone_sizes(self):
        super().validate_backbone_sizes()
        if isinstance(self.d_kv, bool) or self.d_kv < 1:
            raise ValueError(f"`d_kv` must be a positive integer, got {self.d_kv!r}.")


__all__ = ["MgsaConfig", "MgsaT5Config", "MgsaVariantConfig"]
