"""PyTorch MGSA model: a Marian-style seq2seq Transformer whose encoder self-attention can be phrase- or syntax-aware.

With `encoder_type="transformer"` the model is exactly [`~transformers.MarianMTModel`] (same parameter names, same
computation), so opus-mt checkpoints load as they are; the other encoder types replace the self-attention of chosen
encoder layers (MG-SA, hybrid, RHE) or add phrase sub-layers to every layer (PR), as their
[`~mgsa_hf.modeling_variant.Variant`] says. This file holds Marian's backbone only; what both backbones share is in
`modeling_common.py` and the `modeling_*.py` modules it names.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding, shift_tokens_right
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_mgsa import MgsaConfig
from .generation_arguments import CheckedGenerationMixin
from .input_checks import check_token_ids
from .modeling_attention import MgsaAttention
from .modeling_common import (
    BaseModelAutoMapMixin,
    MgsaCheckpointingLayer,
    MgsaForConditionalGenerationMixin,
    MgsaSeq2SeqModelMixin,
    check_length,
    resolve_cache,
)
from .modeling_outputs_mgsa import (
    OUTPUT_CACHE_FIELD,
    MgsaDecoderKwargs,
    MgsaEncoderOutput,
    MgsaLayerOutput,
    MgsaSeq2SeqLMOutput,
    encoder_output,
)
from .modeling_syntax_inputs import MgsaSyntaxInputs
from .modeling_upgrade import VariantUpgradeMixin
from .weights_checksums import WeightsChecksumMixin
from .weights_numerics import CheckedWeightsMixin


logger = logging.get_logger(__name__)


class MgsaPostNormLayer(MgsaCheckpointingLayer):
    """What Marian's encoder and decoder layers share: post-LN residual blocks and the feed-forward sub-layer
    (`fc1`, `fc2`, `final_layer_norm`)."""

    def __init__(self, config, ffn_dim: int, layer_idx: int):
        super().__init__()
        self.embed_dim = config.d_model
        self.layer_idx = layer_idx
        self.dropout = config.dropout
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc1 = nn.Linear(self.embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, self.embed_dim)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim)

    def residual_block(self, residual: torch.Tensor, update: torch.Tensor, layer_norm: nn.LayerNorm) -> torch.Tensor:
        """Post-LN residual connection: LayerNorm(residual + dropout(update))."""
        update = nn.functional.dropout(update, p=self.dropout, training=self.training)
        return layer_norm(residual + update)

    # a sub-layer's residual passes around its norm (pre-norm) or the norm follows the residual (post-LN, Marian)
    pre_norm = False

    def sublayer(
        self, hidden_states: torch.Tensor, function: Callable[[torch.Tensor], torch.Tensor], layer_norm: nn.LayerNorm
    ) -> torch.Tensor:
        """A sub-layer the way this backbone wraps it, for variants that add one (PR): post-LN, as `residual_block`."""
        return self.residual_block(hidden_states, function(hidden_states), layer_norm)

    def make_layer_norm(self) -> nn.LayerNorm:
        """The normalisation of a sub-layer a variant adds."""
        return nn.LayerNorm(self.embed_dim)

    def make_output_layer_norm(self) -> None:
        """Post-LN layer outputs are normalised already: a variant reading them needs no norm of its own."""
        return None

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The position-wise feed-forward sub-layer with its residual block."""
        update = self.activation_fn(self.fc1(hidden_states))
        update = nn.functional.dropout(update, p=self.activation_dropout, training=self.training)
        return self.residual_block(hidden_states, self.fc2(update), self.final_layer_norm)


class MgsaEncoderLayer(MgsaPostNormLayer):
    """
    Marian's post-LN encoder layer. Its self-attention is plain [`MgsaAttention`] or, on the variant's layers, the
    variant's attention module (built by `modeling_mgsa.build_encoder_self_attention`).
    """

    def __init__(self, config, self_attn: MgsaAttention, layer_idx: int):
        super().__init__(config, config.encoder_ffn_dim, layer_idx)
        self.self_attn = self_attn
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        syntax: MgsaSyntaxInputs | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, MgsaLayerOutput]:
        """
        Args:
            hidden_states: (B, L, D); attention_mask: additive (B, 1, L, L) or None.
            syntax: what the self-attention reads: [`MgsaSyntaxInputs`] or the variant's inputs made from them.

        Returns:
            `(hidden_states (B, L, D), what the self-attention contributed)`.
        """
        attn_output, _, contribution = self.self_attn(
            hidden_states, attention_mask=attention_mask, syntax=syntax, **kwargs
        )
        hidden_states = self.residual_block(hidden_states, attn_output, self.self_attn_layer_norm)
        hidden_states = self.feed_forward(hidden_states)
        if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():
            clamp_value = torch.finfo(hidden_states.dtype).max - 1000
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states, contribution if contribution is not None else MgsaLayerOutput()


class MgsaDecoderLayer(MgsaPostNormLayer):
    """Marian's post-LN decoder layer: causal self-attention → cross-attention → feed-forward."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, config.decoder_ffn_dim, layer_idx)
        heads = config.decoder_attention_heads
        self.self_attn = MgsaAttention(config, heads, is_decoder=True, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)
        self.encoder_attn = MgsaAttention(config, heads, is_decoder=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(self.embed_dim)

    def cross_attention(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        **kwargs,
    ) -> torch.Tensor:
        """The cross-attention sub-layer over source tokens (PR adds a phrase sub-layer before it)."""
        attn_output, _, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
        )
        return self.residual_block(hidden_states, attn_output, self.encoder_attn_layer_norm)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs,
    ) -> torch.Tensor:
        """
        Args:
            hidden_states: (B, T, D) target states.
            attention_mask: additive causal mask (B, 1, T, T_past + T) or None.
            encoder_hidden_states: (B, S, D); encoder_attention_mask: additive (B, 1, T, S) or None.
            kwargs: extra source memories a variant's decoder layer reads (PR: `encoder_phrase_states`,
                `encoder_phrase_mask`); ignored here.
        """
        attn_output, _, _ = self.self_attn(
            hidden_states, past_key_values=past_key_values, attention_mask=attention_mask
        )
        hidden_states = self.residual_block(hidden_states, attn_output, self.self_attn_layer_norm)
        if encoder_hidden_states is not None:
            hidden_states = self.cross_attention(
                hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs
            )
        return self.feed_forward(hidden_states)


def build_encoder_layer(config: MgsaConfig, layer_idx: int) -> MgsaEncoderLayer:
    """Encoder layer `layer_idx`: Marian's, with the variant's self-attention on its layers and its mixin (PR)."""
    variant = config.variant
    return variant.encoder_layer_class(MgsaEncoderLayer)(
        config, variant.encoder_self_attention(config, layer_idx), layer_idx
    )


def build_decoder_layer(config: MgsaConfig, layer_idx: int) -> MgsaDecoderLayer:
    """Decoder layer `layer_idx`: Marian's, with the variant's mixin (PR)."""
    return config.variant.decoder_layer_class(MgsaDecoderLayer)(config, layer_idx)


class MgsaPreTrainedModel(CheckedWeightsMixin, VariantUpgradeMixin, WeightsChecksumMixin, PreTrainedModel):
    """The base class of the Marian-backbone models: [`MgsaConfig`], weight initialisation, the upgrade of a Marian
    checkpoint with a variant in `from_pretrained` (`encoder_type=...`), and the weights' checksum and numeric
    checks on load."""

    config: MgsaConfig
    config_class = MgsaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    # the default configuration's layer classes; a model's own are those its configuration builds (PR's carry the
    # variant's mixin): what FSDP's transformer-based wrap policy and `device_map` keep whole
    _no_split_modules = ["MgsaEncoderLayer", "MgsaDecoderLayer"]
    # the class's value holds for the default configuration (tools read it before building a model); a model's own
    # follows its configuration (its variant's `compiles_fullgraph`)
    _can_compile_fullgraph = True

    def __init__(self, config: MgsaConfig, *inputs, **kwargs):
        config.validate()  # a configuration changed after construction (its fields are checked one by one) as a whole
        super().__init__(config, *inputs, **kwargs)
        self._can_compile_fullgraph = config.variant.compiles_fullgraph(config)
        self._no_split_modules = [config.variant.encoder_layer_class(MgsaEncoderLayer).__name__,
                                  config.variant.decoder_layer_class(MgsaDecoderLayer).__name__]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, MarianSinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight())
        elif isinstance(module, MgsaForConditionalGeneration):
            init.zeros_(module.final_logits_bias)
        elif hasattr(module, "init_variant_parameters"):
            # variant modules initialise their own `nn.Parameter`s with `transformers.initialization`
            module.init_variant_parameters(self.config)

    @property
    def dummy_inputs(self):
        pad_token = self.config.pad_token_id
        input_ids = torch.tensor([[0, 6, 10, 4, 2], [0, 8, 12, 2, pad_token]], device=self.device)
        return {"attention_mask": input_ids.ne(pad_token), "input_ids": input_ids, "decoder_input_ids": input_ids}


class MgsaEncoder(MgsaPreTrainedModel):
    """
    Transformer encoder of `config.encoder_layers` layers ([`MgsaEncoderLayer`] or the variant's layer), reading the
    source syntax fields of [`MgsaProcessor`] where the variant needs them.
    """

    _can_record_outputs = {
        "hidden_states": MgsaEncoderLayer,
        "attentions": OutputRecorder(MgsaAttention, index=1, layer_name="self_attn"),
    }

    def __init__(self, config: MgsaConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.encoder_layerdrop
        self.padding_idx = config.pad_token_id
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, self.padding_idx)
        self.embed_positions = MarianSinusoidalPositionalEmbedding(
            config.max_position_embeddings, config.d_model, self.padding_idx
        )
        self.layers = nn.ModuleList([build_encoder_layer(config, i) for i in range(config.encoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        phrase_tags: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
        syntax: MgsaSyntaxInputs | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaEncoderOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`), attention_mask (same shape, 1 = token):
            Source tokens and padding mask.
        word_ids, head_word_ids, phrase_ids, phrase_tags, pr_phrase_ids, local_phrase_start, local_phrase_end,
        tree_depth:
            Source syntax fields made by [`MgsaProcessor`] (see `syntax_fields.py` for shapes and padding values).
            Only the fields the configured variant reads are required.
        syntax ([`MgsaSyntaxInputs`], *optional*):
            The same fields packed, as the encoder-decoder passes them (instead of the fields by name).
        """
        if syntax is None:
            syntax = MgsaSyntaxInputs.pack(locals())
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if input_ids is not None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, "input_ids")
        check_length(inputs_embeds if input_ids is None else input_ids, 0, self.config.max_position_embeddings,
                     "source")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        hidden_states = inputs_embeds + self.embed_positions(inputs_embeds.shape[:-1])
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

        syntax = syntax.with_padding(inputs_embeds, attention_mask)
        layer_syntax = self.config.variant.layer_inputs(self.config, syntax, hidden_states)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        layer_outputs = []
        for encoder_layer in self.layers:
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states, contribution = encoder_layer(hidden_states, attention_mask, syntax=layer_syntax, **kwargs)
            layer_outputs.append(contribution)
        return encoder_output(hidden_states, layer_outputs)


class MgsaDecoder(MgsaPreTrainedModel):
    """Transformer decoder of `config.decoder_layers` layers ([`MgsaDecoderLayer`] or the variant's layer)."""

    _can_record_outputs = {
        "hidden_states": MgsaDecoderLayer,
        "attentions": OutputRecorder(MgsaAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(MgsaAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: MgsaConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.layerdrop = config.decoder_layerdrop
        self.padding_idx = config.pad_token_id
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.decoder_vocab_size, config.d_model, self.padding_idx)
        self.embed_positions = MarianSinusoidalPositionalEmbedding(
            config.max_position_embeddings, config.d_model, self.padding_idx
        )
        self.layers = nn.ModuleList([build_decoder_layer(config, i) for i in range(config.decoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[MgsaDecoderKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        kwargs:
            Passed to every decoder layer, with the source memories a variant's layers read besides
            `encoder_hidden_states` ([`MgsaEncoderOutput.source_memories`]; plain layers ignore them).
        """
        past_key_values = resolve_cache(past_key_values, kwargs)
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of decoder_input_ids or decoder_inputs_embeds")
        if inputs_embeds is None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, "decoder_input_ids (or labels)")
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale

        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        batch_size, seq_length = inputs_embeds.shape[:2]
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None and not torch.compiler.is_compiling():
            # as Marian: under compile the past length of a static cache is a tensor, and a mask that wide would be
            # a data-dependent shape; the mask functions then take the cache's own sizes
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        self_attn_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        # the cache positionally: transformers >= 5.24 calls the parameter `cache`, earlier versions `past_key_values`
        causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, self_attn_cache)
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        if position_ids is None:
            check_length(inputs_embeds, past_length, self.config.max_position_embeddings, "target")
            # from a range and the past length, which a static cache holds in a tensor (a graph input under compile)
            position_ids = torch.arange(seq_length, device=inputs_embeds.device) + past_length
        positions = self.embed_positions((batch_size, seq_length), position_ids=position_ids)
        hidden_states = nn.functional.dropout(inputs_embeds + positions, p=self.dropout, training=self.training)

        for decoder_layer in self.layers:
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            hidden_states = decoder_layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                use_cache=use_cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, **{OUTPUT_CACHE_FIELD: past_key_values}
        )


class MgsaModel(MgsaSeq2SeqModelMixin, MgsaPreTrainedModel):
    """The bare MGSA encoder-decoder, outputting raw decoder states (Marian layout: `shared`, `encoder`, `decoder`)."""

    _keys_to_ignore_on_load_missing = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]

    def __init__(self, config: MgsaConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            self._tied_weights_keys = {
                "decoder.embed_tokens.weight": "shared.weight",
                "encoder.embed_tokens.weight": "shared.weight",
            }
        else:
            self._tied_weights_keys = None
        self.encoder = MgsaEncoder(config)
        self.decoder = MgsaDecoder(config)
        self.post_init()
        if config.share_encoder_decoder_embeddings:
            # one module holds the shared weight, as `set_input_embeddings` leaves it (the tied weights are already
            # one): FSDP2 then finds the weight in one group, with the input embeddings accelerate shards apart
            self.encoder.embed_tokens = self.decoder.embed_tokens = self.shared

    def get_input_embeddings(self):
        return self.get_encoder().get_input_embeddings()

    def set_input_embeddings(self, value):
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.encoder.embed_tokens = self.shared
            self.decoder.embed_tokens = self.shared
        else:
            self.encoder.embed_tokens = value

    def _require_separate_vocabularies(self, method: str, shared_method: str) -> None:
        """The decoder-embedding methods are for separate source and target vocabularies, as Marian's."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                f"`{method}` is for separate source and target vocabularies, but "
                f"`config.share_encoder_decoder_embeddings` is True: use `{shared_method}`."
            )

    def get_decoder_input_embeddings(self) -> nn.Embedding:
        """The target embeddings, with separate source and target vocabularies
        (`share_encoder_decoder_embeddings=False`)."""
        self._require_separate_vocabularies("get_decoder_input_embeddings", "get_input_embeddings")
        return self.get_decoder().get_input_embeddings()

    def set_decoder_input_embeddings(self, value: nn.Embedding) -> None:
        """As `MarianModel`'s: replace the target embeddings (separate vocabularies only)."""
        self._require_separate_vocabularies("set_decoder_input_embeddings", "set_input_embeddings")
        self.decoder.embed_tokens = value

    def resize_decoder_token_embeddings(self, new_num_tokens: int | None) -> nn.Embedding:
        """As `MarianModel`'s: resize the target embeddings to `new_num_tokens` rows (separate vocabularies only) and
        set `config.decoder_vocab_size`."""
        self._require_separate_vocabularies("resize_decoder_token_embeddings", "resize_token_embeddings")
        new_embeddings = self._get_resized_embeddings(self.get_decoder_input_embeddings(), new_num_tokens)
        self.set_decoder_input_embeddings(new_embeddings)
        if new_num_tokens is not None:
            self.config.decoder_vocab_size = new_num_tokens
            self.tie_weights()
        return self.get_decoder_input_embeddings()


class MgsaForConditionalGeneration(
    BaseModelAutoMapMixin, MgsaForConditionalGenerationMixin, MgsaPreTrainedModel, CheckedGenerationMixin,
    GenerationMixin
):
    """
    MGSA with a language-modelling head, for translation: `model(**processor(src, text_target=tgt))` gives the loss,
    `model.generate(**processor(src))` translates. Loads MGSA and Marian (opus-mt) checkpoints alike; modules a Marian
    checkpoint lacks (the variant's) are freshly initialised.
    """

    base_model_prefix = "model"
    base_model_class = MgsaModel
    _keys_to_ignore_on_load_missing = [
        "final_logits_bias",
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    ]
    _keys_to_ignore_on_save = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: MgsaConfig):
        super().__init__(config)
        self.model = MgsaModel(config)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
            }
        target_vocab_size = config.vocab_size if config.share_encoder_decoder_embeddings else config.decoder_vocab_size
        self.final_logits_bias = nn.Buffer(torch.zeros((1, target_vocab_size)))
        self.lm_head = nn.Linear(config.d_model, target_vocab_size, bias=False)
        self.post_init()

    def get_encoder(self):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def get_decoder_input_embeddings(self) -> nn.Embedding:
        """The target embeddings, with separate source and target vocabularies (see [`MgsaModel`])."""
        return self.model.get_decoder_input_embeddings()

    def set_decoder_input_embeddings(self, value: nn.Embedding) -> None:
        """As `MarianMTModel`'s: replace the target embeddings (separate vocabularies only)."""
        self.model.set_decoder_input_embeddings(value)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """As `MarianMTModel`'s: resize the source embeddings and set `config.vocab_size`. With one shared vocabulary
        (`share_encoder_decoder_embeddings`), the target side takes the new size too (the padded one when
        `pad_to_multiple_of` is given): `config.decoder_vocab_size`, the LM head (resized where it is not tied) and
        `final_logits_bias`. With separate vocabularies the target side is left as it is
        ([`resize_decoder_token_embeddings`] resizes it)."""
        new_embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.share_encoder_decoder_embeddings:
            self._resize_final_logits_bias(new_embeddings.weight.shape[0])
        return new_embeddings

    def _resize_token_embeddings(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None,
                                 mean_resizing: bool = True) -> nn.Embedding:
        """What `resize_token_embeddings` resizes before transformers updates `config.vocab_size` and reties the
        weights (the base class would resize the LM head, the target side, whatever the vocabularies)."""
        new_embeddings = self._get_resized_embeddings(
            self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        self.set_input_embeddings(new_embeddings)
        if self.config.share_encoder_decoder_embeddings:
            new_num_tokens = new_embeddings.weight.shape[0]
            self.config.decoder_vocab_size = new_num_tokens
            if not self.config.tie_word_embeddings:
                lm_head = self._get_resized_lm_head(
                    self.get_output_embeddings(), new_num_tokens, mean_resizing=mean_resizing
                )
                self.set_output_embeddings(lm_head)
        return self.get_input_embeddings()

    def resize_decoder_token_embeddings(self, new_num_tokens: int | None) -> nn.Embedding:
        """As `MarianMTModel`'s: with separate source and target vocabularies, resize the target embeddings, the LM
        head (resized where it is not tied) and `final_logits_bias` to `new_num_tokens`, and set
        `config.decoder_vocab_size`."""
        self.model.resize_decoder_token_embeddings(new_num_tokens)
        if new_num_tokens is not None:
            if not self.config.tie_word_embeddings:
                self.set_output_embeddings(self._get_resized_lm_head(self.get_output_embeddings(), new_num_tokens))
            self.tie_weights()
            self._resize_final_logits_bias(new_num_tokens)
        return self.get_decoder_input_embeddings()

    def _resize_final_logits_bias(self, new_num_tokens: int) -> None:
        old_bias = self.final_logits_bias
        if new_num_tokens <= old_bias.shape[-1]:
            new_bias = old_bias[:, :new_num_tokens]
        else:  # new tokens start without a bias
            new_bias = torch.cat([old_bias, old_bias.new_zeros(1, new_num_tokens - old_bias.shape[-1])], dim=1)
        self.final_logits_bias = nn.Buffer(new_bias)

    def language_model_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Marian's head: the output projection plus `final_logits_bias`."""
        return self.lm_head(hidden_states) + self.final_logits_bias

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
        """The decoder inputs (B, T) of `labels` (B, T): shifted right behind `decoder_start_token_id`, with -100
        read as `pad_token_id` (what `DataCollatorForSeq2Seq` asks a model for)."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "MgsaEncoder",
    "MgsaDecoder",
    "MgsaEncoderOutput",
    "MgsaForConditionalGeneration",
    "MgsaModel",
    "MgsaPreTrainedModel",
    "MgsaSeq2SeqLMOutput",
]
