"""PyTorch MGSA-T5 model: the syntax-aware encoder variants inside a T5 (v1.0 or v1.1) seq2seq Transformer.

The layout and parameter names are T5's (`shared`, `encoder.block.{i}.layer.0.SelfAttention.q`, ...,
`layer.1.DenseReluDense`, `final_layer_norm`, `lm_head`), so a [`~transformers.T5ForConditionalGeneration`] folder
loads as it is, and with `encoder_type="transformer"` the computation is T5's: pre-RMSNorm residual blocks, unscaled
attention plus the relative position bias that the first self-attention of each stack owns and every layer shares,
T5's (gated) feed-forward. The variants use the same attention classes as on Marian ([`MgsaAttention`] and its
subclasses, which take T5's projection names from `config.backbone`); how each one uses the relative position bias is
documented on the class (hybrid and RHE add it to their energies, MG-SA to its word heads only, PR's phrase attention
has no bias: phrases have no token position). The attention kernel (eager or sdpa, which takes the position bias too)
is chosen inside [`MgsaAttention`] with `ALL_ATTENTION_FUNCTIONS.get_interface(...)`, so `set_attn_implementation`
switches it as it does for T5.
"""

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.models.marian.modeling_marian import shift_tokens_right
from transformers.models.t5.modeling_t5 import (
    T5Attention,
    T5DenseActDense,
    T5DenseGatedActDense,
    T5LayerFF,
    T5LayerNorm,
    T5PreTrainedModel,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_mgsa import MgsaT5Config
from .generation_arguments import CheckedGenerationMixin
from .input_checks import check_token_ids
from .modeling_attention import MgsaAttention
from .modeling_common import (
    BaseModelAutoMapMixin,
    MgsaCheckpointingLayer,
    MgsaForConditionalGenerationMixin,
    MgsaSeq2SeqModelMixin,
    resolve_cache,
)
from .modeling_outputs_mgsa import (
    OUTPUT_CACHE_FIELD,
    MgsaDecoderKwargs,
    MgsaEncoderOutput,
    MgsaLayerOutput,
    encoder_output,
)
from .modeling_syntax_inputs import MgsaSyntaxInputs
from .modeling_upgrade import VariantUpgradeMixin
from .weights_checksums import WeightsChecksumMixin
from .weights_numerics import CheckedWeightsMixin


def extend_cache(past_key_values: Cache | None, num_layers: int) -> None:
    """Give a dynamic decoder cache a layer per decoder block. Transformers sizes caches by `num_hidden_layers`, which
    T5 configurations map to the encoder depth `num_layers`: a deeper decoder (`num_decoder_layers`) needs more. A
    static cache cannot grow: too few layers there raise a clear error."""
    if isinstance(past_key_values, EncoderDecoderCache):
        for cache in (past_key_values.self_attention_cache, past_key_values.cross_attention_cache):
            if len(cache.layers) < num_layers and not isinstance(cache, DynamicCache):
                raise ValueError(
                    f"The decoder has {num_layers} blocks but its {type(cache).__name__} has {len(cache.layers)} "
                    "layers (transformers sizes it by `num_layers`, the encoder depth): generate with the default "
                    "dynamic cache."
                )
            while isinstance(cache, DynamicCache) and len(cache.layers) < num_layers:
                cache.layers.append(DynamicLayer())


def relative_positions(
    config: MgsaT5Config, query_length: int, key_length: int, bidirectional: bool, past_length: int = 0, device=None
) -> torch.Tensor:
    """T5's relative position buckets (T, S) of queries at positions past_length..past_length + T - 1 and keys at
    0..S - 1: the ids the first block looks its position bias up with ([`MgsaT5Block.position_bias`])."""
    context = torch.arange(query_length, device=device)[:, None] + past_length
    memory = torch.arange(key_length, device=device)[None, :]
    return T5Attention._relative_position_bucket(
        memory - context,
        bidirectional=bidirectional,
        num_buckets=config.relative_attention_num_buckets,
        max_distance=config.relative_attention_max_distance,
    )


class MgsaT5LayerSelfAttention(nn.Module):
    """T5's self-attention sub-layer (`SelfAttention`, `layer_norm`): x + dropout(attention(RMSNorm(x)))."""

    def __init__(self, config: MgsaT5Config, self_attn: MgsaAttention):
        super().__init__()
        self.SelfAttention = self_attn
        self.layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs
    ) -> tuple[torch.Tensor, MgsaLayerOutput]:
        """`(hidden_states + dropout(attention(RMSNorm(hidden_states))), what the attention contributed)`."""
        attn_output, _, contribution = self.SelfAttention(
            self.layer_norm(hidden_states), attention_mask=attention_mask, **kwargs
        )
        contribution = contribution if contribution is not None else MgsaLayerOutput()
        return hidden_states + self.dropout(attn_output), contribution


class MgsaT5LayerCrossAttention(nn.Module):
    """T5's cross-attention sub-layer (`EncDecAttention`, `layer_norm`); cross-attention has no position bias."""

    def __init__(self, config: MgsaT5Config, layer_idx: int):
        super().__init__()
        self.EncDecAttention = MgsaAttention(config, config.num_heads, is_decoder=True, layer_idx=layer_idx)
        self.layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
    ) -> torch.Tensor:
        """`hidden_states + dropout(cross_attention(RMSNorm(hidden_states), key_value_states))`, (B, T, d_model)."""
        attn_output, _, _ = self.EncDecAttention(
            self.layer_norm(hidden_states),
            key_value_states=key_value_states,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
        )
        return hidden_states + self.dropout(attn_output)


def clamp_inf(hidden_states: torch.Tensor) -> torch.Tensor:
    """T5's fp16 guard: clamp infinities to the largest finite value."""
    if hidden_states.dtype == torch.float16 and torch.isinf(hidden_states).any():
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
    return hidden_states


class MgsaT5Block(MgsaCheckpointingLayer):
    """What T5's encoder and decoder blocks share: pre-RMSNorm residual sub-layers in `layer` (feed-forward last)."""

    def __init__(self, config: MgsaT5Config, layer_idx: int):
        super().__init__()
        self.embed_dim = config.d_model
        self.layer_idx = layer_idx
        self.dropout = config.dropout_rate
        self.layer_norm_epsilon = config.layer_norm_epsilon
        self.layer = nn.ModuleList()

    pre_norm = True  # T5 normalises a sub-layer's input; the residual passes around it

    def sublayer(self, hidden_states: torch.Tensor, function, layer_norm: nn.Module) -> torch.Tensor:
        """A sub-layer the way T5 wraps it, for variants that add one (PR): x + dropout(function(RMSNorm(x)))."""
        update = function(layer_norm(hidden_states))
        return hidden_states + nn.functional.dropout(update, p=self.dropout, training=self.training)

    def make_layer_norm(self) -> T5LayerNorm:
        """The normalisation of a sub-layer a variant adds."""
        return T5LayerNorm(self.embed_dim, eps=self.layer_norm_epsilon)

    def make_output_layer_norm(self) -> T5LayerNorm:
        """Pre-norm block outputs are not normalised: a variant reading them (PR's last phrase level) has its own."""
        return self.make_layer_norm()

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The block's feed-forward sub-layer (T5's, with its residual), with infinities clamped as T5 does in
        float16."""
        return clamp_inf(self.layer[-1](hidden_states))

    def position_bias(self, position_bias: torch.Tensor | None, relative_positions: torch.Tensor) -> torch.Tensor:
        """
        The relative position bias (1, H, T, S) of the self-attention: `position_bias` as the block before passed it
        on, or, in the first block (which owns T5's table), the table's rows for the bucket ids `relative_positions`
        (T, S). The first block looks it up inside its own forward and returns it for the next: FSDP gathers a
        block's parameters for that block's forward only, and the table's gradient comes back through it.
        """
        if position_bias is not None:
            return position_bias
        table = self.layer[0].SelfAttention.relative_attention_bias
        return table(relative_positions.to(table.weight.device)).permute(2, 0, 1).unsqueeze(0)


class MgsaT5EncoderBlock(MgsaT5Block):
    """T5's encoder block: self-attention (plain, or the variant's on `config.variant_layers`) → feed-forward."""

    def __init__(self, config: MgsaT5Config, self_attn: MgsaAttention, layer_idx: int):
        super().__init__(config, layer_idx)
        self.layer.append(MgsaT5LayerSelfAttention(config, self_attn))
        self.layer.append(T5LayerFF(config))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        syntax: MgsaSyntaxInputs | None = None,
        position_bias: torch.Tensor | None = None,
        relative_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, MgsaLayerOutput, torch.Tensor]:
        """
        hidden_states (B, L, D), attention_mask for (B, 1, L, L) or None, position_bias (1, H, L, L) (None in the
        first block, which looks it up for `relative_positions`, see [`position_bias`]), `syntax` what the
        self-attention reads → `(hidden_states (B, L, D), what the self-attention contributed, position_bias)`.
        """
        position_bias = self.position_bias(position_bias, relative_positions)
        hidden_states, contribution = self.layer[0](
            hidden_states, attention_mask, syntax=syntax, position_bias=position_bias, **kwargs
        )
        return self.feed_forward(clamp_inf(hidden_states)), contribution, position_bias


class MgsaT5DecoderBlock(MgsaT5Block):
    """T5's decoder block: causal self-attention → cross-attention → feed-forward."""

    def __init__(self, config: MgsaT5Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self_attn = MgsaAttention(
            config,
            config.num_heads,
            is_decoder=True,
            is_causal=True,
            layer_idx=layer_idx,
            has_relative_attention_bias=layer_idx == 0,
        )
        self.layer.append(MgsaT5LayerSelfAttention(config, self_attn))
        self.layer.append(MgsaT5LayerCrossAttention(config, layer_idx))
        self.layer.append(T5LayerFF(config))

    def cross_attention(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        **kwargs,
    ) -> torch.Tensor:
        """The cross-attention sub-layer over source tokens (PR adds a phrase sub-layer before it)."""
        return clamp_inf(self.layer[1](hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        position_bias: torch.Tensor | None = None,
        relative_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            hidden_states: (B, T, D); attention_mask: causal mask for (B, 1, T, T_past + T) or None.
            position_bias: (1, H, T, T_past + T) relative position bias of the self-attention; None in the first
                block, which looks it up for `relative_positions` ([`position_bias`]).
            kwargs: extra source memories a variant's block reads (PR: `encoder_phrase_states`, `encoder_phrase_mask`).

        Returns:
            `(hidden_states (B, T, D), position_bias)`.
        """
        position_bias = self.position_bias(position_bias, relative_positions)
        hidden_states, _ = self.layer[0](
            hidden_states, attention_mask, position_bias=position_bias, past_key_values=past_key_values
        )
        hidden_states = clamp_inf(hidden_states)
        if encoder_hidden_states is not None:
            hidden_states = self.cross_attention(
                hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs
            )
        return self.feed_forward(hidden_states), position_bias


def build_encoder_block(config: MgsaT5Config, layer_idx: int) -> MgsaT5EncoderBlock:
    """Encoder block `layer_idx`: T5's, with the variant's self-attention on its layers and its mixin (PR); the first
    block owns the relative position bias table."""
    variant = config.variant
    self_attn = variant.encoder_self_attention(config, layer_idx, has_relative_attention_bias=layer_idx == 0)
    return variant.encoder_layer_class(MgsaT5EncoderBlock)(config, self_attn, layer_idx)


def build_decoder_block(config: MgsaT5Config, layer_idx: int) -> MgsaT5DecoderBlock:
    """Decoder block `layer_idx`: T5's, with the variant's mixin (PR)."""
    return config.variant.decoder_layer_class(MgsaT5DecoderBlock)(config, layer_idx)


class MgsaT5PreTrainedModel(CheckedWeightsMixin, VariantUpgradeMixin, WeightsChecksumMixin, T5PreTrainedModel):
    """The base class of the T5-backbone models: [`MgsaT5Config`], T5's weight initialisation, the upgrade of a T5
    checkpoint with a variant in `from_pretrained` (`encoder_type=...`), and the weights' checksum and numeric checks
    on load."""

    config: MgsaT5Config
    config_class = MgsaT5Config
    base_model_prefix = "transformer"
    # as on the Marian backbone: the default configuration's blocks, and a model's own from its configuration
    _no_split_modules = ["MgsaT5EncoderBlock", "MgsaT5DecoderBlock"]
    # the relative position bias is added to the logits, which flash attention cannot take
    _supports_flash_attn = False
    _supports_flex_attn = False
    # as on the Marian backbone: the default configuration's value, and a model's own from its configuration
    _can_compile_fullgraph = True
    _can_record_outputs = {}

    def __init__(self, config: MgsaT5Config, *inputs, **kwargs):
        config.validate()  # a configuration changed after construction (its fields are checked one by one) as a whole
        super().__init__(config, *inputs, **kwargs)
        self._can_compile_fullgraph = config.variant.compiles_fullgraph(config)
        self._no_split_modules = [config.variant.encoder_layer_class(MgsaT5EncoderBlock).__name__,
                                  config.variant.decoder_layer_class(MgsaT5DecoderBlock).__name__]

    def t5_weight_stds(self) -> dict[int, float]:
        """The std T5 draws each of its linear and embedding weights with (module id → std): its attention scheme for
        every [`MgsaAttention`], its feed-forward scheme, `initializer_factor` for the embeddings and the LM head."""
        factor, stds = self.config.initializer_factor, {}
        for module in self.modules():
            if isinstance(module, MgsaAttention):
                stds[id(module.query_proj)] = factor * (module.embed_dim * module.head_dim) ** -0.5
                stds[id(module.key_proj)] = stds[id(module.value_proj)] = factor * module.embed_dim**-0.5
                stds[id(module.output_proj)] = factor * module.inner_dim**-0.5
                if hasattr(module, "relative_attention_bias"):
                    stds[id(module.relative_attention_bias)] = factor * module.embed_dim**-0.5
            elif isinstance(module, (T5DenseActDense, T5DenseGatedActDense)):
                for name in ("wi", "wi_0", "wi_1"):
                    if hasattr(module, name):
                        stds[id(getattr(module, name))] = factor * self.config.d_model**-0.5
                stds[id(module.wo)] = factor * self.config.d_ff**-0.5
            for name in ("shared", "embed_tokens", "lm_head"):
                if isinstance(getattr(module, name, None), nn.Module):
                    stds[id(getattr(module, name))] = factor
        return stds

    def initialize_weights(self):
        """Transformers' pass over every module, with the stds of [`t5_weight_stds`] worked out once for the whole
        pass (and handed to the sub-models it dispatches to) instead of once per linear or embedding layer."""
        stacks = [module for module in self.modules() if isinstance(module, MgsaT5PreTrainedModel)]
        stds = self.t5_weight_stds()
        for stack in stacks:
            stack._weight_stds = stds
        try:
            super().initialize_weights()
        finally:
            for stack in stacks:
                del stack._weight_stds

    @torch.no_grad()
    def _init_weights(self, module):
        """T5's initialisation: its norms, and every linear and embedding weight with the std T5 gives it
        ([`t5_weight_stds`]). T5 names no rule for the variants' own linear and embedding layers, for which
        transformers' default would be std `initializer_factor` (1.0, saturating every sigmoid behind a D-wide layer):
        they get T5's scale for a matrix reading d_model inputs (`variant_init_std`). Then the variants' own
        parameters."""
        super()._init_weights(module)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            stds = getattr(self, "_weight_stds", None) or self.t5_weight_stds()
            std = stds.get(id(module), self.config.variant_init_std)
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        if hasattr(module, "init_variant_parameters"):
            module.init_variant_parameters(self.config)


class MgsaT5Stack(MgsaT5PreTrainedModel):
    """What T5's encoder and decoder stacks share: `embed_tokens`, the blocks, `final_layer_norm` and dropout."""

    def __init__(self, config: MgsaT5Config, blocks: list[MgsaT5Block]):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.block = nn.ModuleList(blocks)
        self.final_layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.gradient_checkpointing = False
        self.post_init()

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings


class MgsaT5Encoder(MgsaT5Stack):
    """T5 encoder stack of `config.num_layers` blocks ([`MgsaT5EncoderBlock`] or the variant's), reading the source
    syntax fields of [`MgsaProcessor`] where the variant needs them."""

    _can_record_outputs = {
        "hidden_states": MgsaT5EncoderBlock,
        "attentions": OutputRecorder(MgsaAttention, index=1, layer_name="SelfAttention"),
    }

    def __init__(self, config: MgsaT5Config):
        super().__init__(config, [build_encoder_block(config, i) for i in range(config.num_layers)])

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
        input_ids (`(batch_size, seq_len)`), attention_mask (same shape, 1 = token):
            Source tokens and padding mask.
        word_ids, head_word_ids, phrase_ids, phrase_tags, pr_phrase_ids, local_phrase_start, local_phrase_end,
        tree_depth:
            Source syntax fields made by [`MgsaProcessor`]; only those the configured variant reads are required.
        syntax ([`MgsaSyntaxInputs`], *optional*):
            The same fields packed, as the encoder-decoder passes them (instead of the fields by name).
        """
        if syntax is None:
            syntax = MgsaSyntaxInputs.pack(locals())
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, "input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        syntax = syntax.with_padding(inputs_embeds, attention_mask)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        length = inputs_embeds.shape[1]
        positions = relative_positions(self.config, length, length, bidirectional=True, device=inputs_embeds.device)
        hidden_states = self.dropout(inputs_embeds)
        block_syntax = self.config.variant.layer_inputs(self.config, syntax, hidden_states)
        block_outputs, position_bias = [], None  # the first block looks the bias up, the others take it from it
        for block in self.block:
            hidden_states, contribution, position_bias = block(
                hidden_states, attention_mask, syntax=block_syntax, position_bias=position_bias,
                relative_positions=positions, **kwargs
            )
            block_outputs.append(contribution)
        hidden_states = self.dropout(self.final_layer_norm(hidden_states))
        return encoder_output(hidden_states, block_outputs)


class MgsaT5Decoder(MgsaT5Stack):
    """T5 decoder stack of `config.num_decoder_layers` blocks ([`MgsaT5DecoderBlock`] or the variant's)."""

    _can_record_outputs = {
        "hidden_states": MgsaT5DecoderBlock,
        "attentions": OutputRecorder(MgsaAttention, index=1, layer_name="SelfAttention"),
        "cross_attentions": OutputRecorder(MgsaAttention, index=1, layer_name="EncDecAttention"),
    }

    def __init__(self, config: MgsaT5Config):
        super().__init__(config, [build_decoder_block(config, i) for i in range(config.num_decoder_layers)])

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
        **kwargs: Unpack[MgsaDecoderKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        kwargs:
            Passed to every decoder block, with the source memories a variant's blocks read besides
            `encoder_hidden_states` ([`MgsaEncoderOutput.source_memories`]; plain blocks ignore them).
        """
        past_key_values = resolve_cache(past_key_values, kwargs)
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of decoder_input_ids or decoder_inputs_embeds")
        if inputs_embeds is None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, "decoder_input_ids (or labels)")
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        extend_cache(past_key_values, len(self.block))
        self_attn_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        past_length = self_attn_cache.get_seq_length() if self_attn_cache is not None else 0
        # the cache positionally: transformers >= 5.24 calls the parameter `cache`, earlier versions `past_key_values`
        causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, self_attn_cache)
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        length = inputs_embeds.shape[1]
        # the keys the self-attention sees: the past and new tokens, or a static cache's every slot (its length a
        # number even where the past length is a tensor)
        key_length = self_attn_cache.get_mask_sizes(length, 0)[0] if self_attn_cache is not None else length
        positions = relative_positions(
            self.config, length, key_length, bidirectional=False, past_length=past_length, device=inputs_embeds.device
        )
        hidden_states, position_bias = self.dropout(inputs_embeds), None  # the first block looks the bias up
        for block in self.block:
            hidden_states, position_bias = block(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                position_bias=position_bias,
                relative_positions=positions,
                **kwargs,
            )
        hidden_states = self.dropout(self.final_layer_norm(hidden_states))
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, **{OUTPUT_CACHE_FIELD: past_key_values}
        )


def share_embedding_module(model) -> None:
    """Make `shared` the stacks' `embed_tokens` module, as `set_input_embeddings` does (their weights are already tied
    into one): FSDP2 then finds the weight in one group, with the input embeddings that accelerate shards apart."""
    model.encoder.embed_tokens = model.decoder.embed_tokens = model.shared


class MgsaT5Model(MgsaSeq2SeqModelMixin, MgsaT5PreTrainedModel):
    """The bare MGSA-T5 encoder-decoder, outputting raw decoder states (T5 layout: `shared`, `encoder`, `decoder`)."""

    _keys_to_ignore_on_load_unexpected = ["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"]
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: MgsaT5Config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = MgsaT5Encoder(config)
        self.decoder = MgsaT5Decoder(config)
        self.post_init()
        share_embedding_module(self)

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, new_embeddings):
        self.shared = new_embeddings
        self.encoder.set_input_embeddings(new_embeddings)
        self.decoder.set_input_embeddings(new_embeddings)

    def get_encoder(self):
        return self.encoder

    def get_decoder(self):
        return self.decoder


class MgsaT5ForConditionalGeneration(
    BaseModelAutoMapMixin, MgsaForConditionalGenerationMixin, MgsaT5PreTrainedModel, CheckedGenerationMixin,
    GenerationMixin
):
    """
    MGSA-T5 with T5's language-modelling head, for translation: `model(**processor(src, text_target=tgt))` gives the
    loss (plus `phrase_tag_loss_weight` times MG-SA's tag loss), `model.generate(**processor(src))` translates. Loads
    MGSA-T5 and T5 checkpoints alike; modules a T5 checkpoint lacks (the variant's) are freshly initialised.
    """

    base_model_class = MgsaT5Model
    _keys_to_ignore_on_load_unexpected = ["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"]
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
        "lm_head.weight": "shared.weight",
    }

    def __init__(self, config: MgsaT5Config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = MgsaT5Encoder(config)
        self.decoder = MgsaT5Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        share_embedding_module(self)

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, new_embeddings):
        self.shared = new_embeddings
        self.encoder.set_input_embeddings(new_embeddings)
        self.decoder.set_input_embeddings(new_embeddings)

    def get_encoder(self):
        return self.encoder

    def get_decoder(self):
        return self.decoder

    def _shift_right(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """Decoder inputs from labels; the decoder starts from `decoder_start_token_id` (T5: the pad token)."""
        pad = self.config.pad_token_id
        start = self.config.decoder_start_token_id
        return shift_tokens_right(input_ids, pad, pad if start is None else start)

    def language_model_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """T5's head, the decoder states scaled by d_model^-0.5 first where the output embeddings are the input
        ones."""
        if self.config.scale_decoder_outputs:  # tied input/output embeddings
            hidden_states = hidden_states * (self.config.d_model**-0.5)
        return self.lm_head(hidden_states)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
        """The decoder inputs (B, T) of `labels` (B, T), shifted right as T5 does."""
        return self._shift_right(labels)


__all__ = [
    "MgsaT5Decoder",
    "MgsaT5Encoder",
    "MgsaT5ForConditionalGeneration",
    "MgsaT5Model",
    "MgsaT5PreTrainedModel",
]
