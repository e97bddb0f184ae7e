"""MGSA model configurations: a Marian or a T5 configuration plus the syntax-aware encoder and its settings.

The variants' own fields come from their modules (`variants.py` registers them): [`MgsaVariantConfig`] is every
variant's `config_fields` mixin together, with the fields every variant shares.
"""

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers.models.marian.configuration_marian import MarianConfig
from transformers.models.t5.configuration_t5 import T5Config

from .configuration_fields import checked_field, smoothing
from .variants import ENCODER_TYPES, VARIANTS


# keyword arguments that `PretrainedConfig.from_dict` itself handles
_FROM_DICT_OWN_KEYS = {"dtype", "torch_dtype", "num_labels", "attn_implementation", "experts_implementation",
                       "output_attentions", "name_or_path"}
# a key every `config.json` this package writes holds (its `to_dict` writes every field; this one since the first
# version): such a config predates a field it lacks
_SAVED_BY_THIS_PACKAGE_KEY = "pr_attentive"

_VARIANT_FIELD_MIXINS = tuple(variant.config_fields for variant in VARIANTS.values() if variant.config_fields)
# unknown keyword arguments with these prefixes are taken for misspelt variant fields (backbone configs carry legacy
# keys of their own, which load as transformers loads them)
VARIANT_FIELD_PREFIXES = tuple(prefix for variant in VARIANTS.values() for prefix in variant.field_prefixes)

_SHARED_FIELDS_DOC = r"""
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
            Trainer's `label_smoothing_factor` (with [`MgsaSeq2SeqTrainer`], which keeps the tag loss). The package's
            recipes (`recipes/*.yaml`) use the Trainer's `label_smoothing_factor:
            0.1` and leave this field at 0.0, so the models they train are trained with ε = 0.1 while their saved
            config says 0.0: `model(**batch).loss` outside the Trainer is then the unsmoothed loss.
"""


@dataclass(kw_only=True, repr=False)
class MgsaVariantConfig(*_VARIANT_FIELD_MIXINS):
    # the backbone's attention layout (`modeling_attention.ATTENTION_LAYOUTS`) and the model_type its checkpoints carry
    backbone = "marian"
    source_model_type = "marian"

    encoder_type: Literal[ENCODER_TYPES] = "transformer"
    label_smoothing: float | int = checked_field(0.0, smoothing)

    def __post_init__(self, **kwargs):
        self.reject_unknown_fields(kwargs, only_variant_like=True)
        for variant in VARIANTS.values():
            if variant.layers_field and getattr(self, variant.layers_field) is None:
                # the default layers the encoder has (at least the bottom one: a 0-layer encoder fails its own check)
                layers = [layer for layer in variant.default_layers if layer < self.encoder_layers] or [0]
                setattr(self, variant.layers_field, layers)
            for name, value in variant.none_defaults.items():
                if getattr(self, name) is None:
                    setattr(self, name, list(value))
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
        variant_fields = [field.name for mixin in _VARIANT_FIELD_MIXINS for field in dataclasses.fields(mixin)]
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
        if _SAVED_BY_THIS_PACKAGE_KEY in config_dict:  # every field it had is there
            legacy_values = {
                name: value(config_dict) if callable(value) else value
                for variant in VARIANTS.values() for name, value in variant.legacy_values.items()
            }
            config_dict = {**legacy_values, **config_dict}
        config_dict = dict(config_dict)
        for name in [name for name in kwargs if name in cls.field_names() and name not in _FROM_DICT_OWN_KEYS]:
            config_dict[cls.attribute_map.get(name, name)] = kwargs.pop(name)
        cls.reject_unknown_fields([name for name in kwargs if name != "return_unused_kwargs"], only_variant_like=True)
        return super().from_dict(config_dict, **kwargs)

    @property
    def variant(self):
        """The [`~mgsa_hf.modeling_variant.Variant`] of `encoder_type`."""
        return VARIANTS[self.encoder_type]

    @property
    def reads_source_syntax(self) -> bool:
        """Whether the model reads any source syntax field (its variant's `syntax_fields`): `False` for the
        transformer, hybrid attention and n-gram MG-SA, whose processor then only tokenizes and never loads spaCy."""
        return bool(self.variant.syntax_fields(self))

    @property
    def source_syntax_fields(self) -> tuple[str, ...]:
        """The processor's syntax fields that the model's logits read (its variant's `syntax_fields`): what to pass
        as the processor's `syntax_fields=` to make no others. MG-SA's tag loss also reads `phrase_tags`."""
        return tuple(self.variant.syntax_fields(self))

    @property
    def variant_layers(self) -> list[int]:
        """Encoder layers whose self-attention the chosen variant replaces (empty for a variant of whole layers)."""
        return self.variant.layers(self)

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

    def validate_dropouts(self):
        """The backbone's dropout probabilities lie in [0, 1] (torch refused 2 only once the model was built)."""
        for field in ("dropout", "attention_dropout", "activation_dropout", "classifier_dropout", "dropout_rate"):
            value = getattr(self, field, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 <= value <= 1.0):
                name = self.attribute_map.get(field, field)  # T5's own name
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")

    def validate_variant_layers(self):
        """Each variant's layer indices lie within the encoder."""
        for variant in VARIANTS.values():
            if variant.layers_field is None:
                continue
            field, layers = variant.layers_field, getattr(self, variant.layers_field)
            if self.encoder_type == variant.name and not layers:
                raise ValueError(f"`{field}` must name at least one encoder layer for encoder_type={variant.name!r}.")
            outside = [layer for layer in layers if not 0 <= layer < self.encoder_layers]
            if outside:
                raise ValueError(
                    f"`{field}` {layers!r} names layers {outside} outside the encoder's {self.encoder_layers} layers "
                    f"(indices 0 to {self.encoder_layers - 1})."
                )


# the docstring: the shared fields, then each variant's
MgsaVariantConfig.__doc__ = _SHARED_FIELDS_DOC.rstrip("\n") + "".join(
    "\n" + mixin.__doc__.strip("\n") for mixin in _VARIANT_FIELD_MIXINS
) + "\n"


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
        """Each attention's head count divides `d_model` (Marian splits the width evenly over the heads)."""
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
        """The backbone's sizes are positive, T5's `d_kv` (the width of one head) included."""
        super().validate_backbone_sizes()
        if isinstance(self.d_kv, bool) or self.d_kv < 1:
            raise ValueError(f"`d_kv` must be a positive integer, got {self.d_kv!r}.")


__all__ = ["MgsaConfig", "MgsaT5Config", "MgsaVariantConfig"]
