"""PyTorch MGSA model: a Marian-style seq2seq Transformer whose encoder self-attention can be phrase- or syntax-aware.

With `encoder_type="transformer"` the model is exactly [`~transformers.MarianMTModel`] (same parameter names, same
computation), so opus-mt checkpoints load as they are; the other encoder types replace the self-attention of chosen
encoder layers (MG-SA, hybrid, RHE) or add phrase sub-layers to every layer (PR).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding, shift_tokens_right
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_mgsa import MgsaConfig
from .generation_arguments import CheckedGenerationMixin
from .hybrid import HybridAttention
from .modeling_layers import (
    OUTPUT_CACHE_FIELD,
    MgsaAttention,
    MgsaDecoderLayer,
    MgsaEncoderLayer,
    MgsaLayerOutput,
    MgsaSyntaxInputs,
    VariantUpgradeMixin,
    resolve_cache,
    source_syntax_fields,
)
from .phrase_memory import PhraseMemoryAttention, PhraseMemoryInputs
from .phrase_representation import (
    PhraseRepresentationDecoderLayer,
    PhraseRepresentationEncoderLayer,
    PhraseRepresentationInputs,
)
from .rhe import RheAttention, RheInputs
from .weights_checksums import WeightsChecksumMixin


logger = logging.get_logger(__name__)

# encoder_type -> the self-attention of the variant's encoder layers (`config.variant_layers`)
ENCODER_SELF_ATTENTIONS = {"phrase_memory": PhraseMemoryAttention, "hybrid": HybridAttention, "rhe": RheAttention}
# encoder_type -> layer classes that replace whole encoder / decoder layers
ENCODER_LAYERS = {"phrase_representation": PhraseRepresentationEncoderLayer}
DECODER_LAYERS = {"phrase_representation": PhraseRepresentationDecoderLayer}


def variant_inputs(config, syntax: MgsaSyntaxInputs, hidden_states: torch.Tensor):
    """What the variant's layers read, made once per forward from the source syntax (either backbone): MG-SA's phrase
    partition, PR's segmentation and phrase mask (for the encoder's `hidden_states`), RHE's relations; the syntax
    itself for the others."""
    if config.encoder_type == "phrase_memory":
        return PhraseMemoryInputs.from_syntax(config, syntax)
    if config.encoder_type == "phrase_representation":
        return PhraseRepresentationInputs.from_syntax(config, syntax, hidden_states)
    if config.encoder_type == "rhe":
        return RheInputs.from_syntax(config, syntax)
    return syntax


def compiles_fullgraph(config) -> bool:
    """Whether a model of `config` (either backbone) runs under `torch.compile(fullgraph=True)`, training forward and
    static-cache decoding alike: every encoder type does except MG-SA with a recurrence (`phrase_interaction="lstm"`
    or `"on_lstm"`, `phrase_composition="lstm"`), whose number of steps depends on the sentences, so it runs eagerly
    between compiled graphs."""
    if config.encoder_type != "phrase_memory":
        return True
    return config.phrase_interaction == "none" and config.phrase_composition != "lstm"


def build_encoder_self_attention(config, layer_idx: int, **kwargs) -> MgsaAttention:
    """The self-attention of encoder layer `layer_idx`: the variant's on `config.variant_layers`, plain otherwise
    (either backbone; `kwargs` go to the attention, e.g. T5's `has_relative_attention_bias`)."""
    attention_class = MgsaAttention
    if layer_idx in config.variant_layers:
        attention_class = ENCODER_SELF_ATTENTIONS[config.encoder_type]
    return attention_class(config, config.encoder_attention_heads, layer_idx=layer_idx, **kwargs)


def build_encoder_layer(config: MgsaConfig, layer_idx: int) -> MgsaEncoderLayer:
    """Encoder layer `layer_idx` for `config.encoder_type`."""
    self_attn = build_encoder_self_attention(config, layer_idx)
    layer_class = ENCODER_LAYERS.get(config.encoder_type, MgsaEncoderLayer)
    return layer_class(config, self_attn, layer_idx)


def build_decoder_layer(config: MgsaConfig, layer_idx: int) -> MgsaDecoderLayer:
    """Decoder layer `layer_idx` for `config.encoder_type`."""
    return DECODER_LAYERS.get(config.encoder_type, MgsaDecoderLayer)(config, layer_idx)


class MgsaDecoderKwargs(TransformersKwargs, total=False):
    """
    The keyword arguments of a decoder's forward: [`~transformers.utils.TransformersKwargs`] and what a variant's
    decoder layers read from the source besides its hidden states ([`MgsaEncoderOutput.source_memories`]).

    encoder_phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`):
        PR: the source phrases of every encoder level.
    encoder_phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`):
        PR: `True` for real phrases.
    """

    encoder_phrase_states: torch.FloatTensor
    encoder_phrase_mask: torch.BoolTensor


@dataclass
class MgsaEncoderOutput(BaseModelOutput):
    r"""
    tag_loss (`torch.FloatTensor` of shape `(batch_size,)`, *optional*):
        MG-SA phrase-tag cross-entropy per sentence (averaged over its phrases and supervised layers), when the
        model predicts tags and the batch carries `phrase_tags`. Per sentence so that it expands with beams.
    gates (`tuple(torch.FloatTensor)`, *optional*):
        Hybrid: per variant layer, the local/global gate `(batch_size, seq_len)` or `(batch_size, heads, seq_len)`.
    head_labels (`tuple(torch.LongTensor)`, *optional*):
        RHE: per variant layer, `(batch_size, heads)` with 1 for important and 0 for redundant heads.
    phrase_states (`torch.FloatTensor` of shape `(batch_size, encoder_layers + 1, num_phrases, d_model)`, *optional*):
        PR: the source phrase representations of the embeddings and of every encoder layer.
    phrase_mask (`torch.BoolTensor` of shape `(batch_size, num_phrases)`, *optional*):
        PR: `True` for real phrases.
    """

    tag_loss: torch.FloatTensor | None = None
    gates: tuple[torch.FloatTensor, ...] | None = None
    head_labels: tuple[torch.LongTensor, ...] | None = None
    phrase_states: torch.FloatTensor | None = None
    phrase_mask: torch.BoolTensor | None = None

    def source_memories(self) -> dict[str, torch.Tensor]:
        """What a variant's decoder layers read from the source besides its hidden states, as keyword arguments for
        the decoder (PR: `encoder_phrase_states`, `encoder_phrase_mask`); empty for the other variants."""
        if self.phrase_states is None:
            return {}
        return {"encoder_phrase_states": self.phrase_states, "encoder_phrase_mask": self.phrase_mask}


@dataclass
class MgsaSeq2SeqModelOutput(Seq2SeqModelOutput):
    r"""
    encoder_tag_loss, encoder_gates, encoder_head_labels:
        The encoder's [`MgsaEncoderOutput`] fields of the same names.
    """

    encoder_tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


@dataclass
class MgsaSeq2SeqLMOutput(Seq2SeqLMOutput):
    r"""
    translation_loss (`torch.FloatTensor`, *optional*):
        The cross-entropy of the labels alone (label-smoothed by `config.label_smoothing`); `loss` adds
        `phrase_tag_loss_weight * tag_loss` when there is one.
    tag_loss (`torch.FloatTensor`, *optional*):
        MG-SA phrase-tag loss of the batch (mean of the encoder's per-sentence `tag_loss`).
    encoder_gates, encoder_head_labels:
        See [`MgsaEncoderOutput`]; returned with `output_gates=True` / `output_head_labels=True`.
    """

    translation_loss: torch.FloatTensor | None = None
    tag_loss: torch.FloatTensor | None = None
    encoder_gates: tuple[torch.FloatTensor, ...] | None = None
    encoder_head_labels: tuple[torch.LongTensor, ...] | None = None


class MgsaPreTrainedModel(VariantUpgradeMixin, WeightsChecksumMixin, PreTrainedModel):
    config: MgsaConfig
    config_class = MgsaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _no_split_modules = ["MgsaEncoderLayer", "MgsaDecoderLayer"]
    # the class's value holds for the default configuration (tools read it before building a model); a model's own
    # follows its configuration (`compiles_fullgraph`)
    _can_compile_fullgraph = True

    def __init__(self, config: MgsaConfig, *inputs, **kwargs):
        config.validate()  # a configuration changed after construction (its fields are checked one by one) as a whole
        super().__init__(config, *inputs, **kwargs)
        self._can_compile_fullgraph = compiles_fullgraph(config)

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


def encoder_output(hidden_states: torch.Tensor, layer_outputs: list[MgsaLayerOutput]) -> MgsaEncoderOutput:
    """The encoder output: the last hidden states and what the layers contributed, in layer order (either
    backbone): the mean of the tag losses, the gates and head labels per variant layer, PR's phrase levels stacked."""
    tag_losses = [output.tag_loss for output in layer_outputs if output.tag_loss is not None]
    gates = tuple(output.gates for output in layer_outputs if output.gates is not None)
    head_labels = tuple(output.head_labels for output in layer_outputs if output.head_labels is not None)
    phrase_states = [states for output in layer_outputs for states in output.phrase_states]
    phrase_masks = [output.phrase_mask for output in layer_outputs if output.phrase_mask is not None]
    return MgsaEncoderOutput(
        last_hidden_state=hidden_states,
        tag_loss=torch.stack(tag_losses).mean(0) if tag_losses else None,
        gates=gates or None,
        head_labels=head_labels or None,
        phrase_states=torch.stack(phrase_states, dim=1) if phrase_states else None,
        phrase_mask=phrase_masks[0] if phrase_masks else None,
    )


def check_length(tokens: torch.Tensor, past_length: int | torch.Tensor, limit: int, side: str) -> None:
    """A clear error instead of an index error deep inside the position embedding when a sequence (B, T, ...) that
    follows `past_length` cached tokens is longer than the model's `max_position_embeddings`. A static cache counts
    its tokens in a tensor: under `torch.compile` that count is checked on the device, without a graph break."""
    length = past_length + tokens.shape[1]
    if isinstance(length, torch.Tensor) and torch.compiler.is_compiling():
        torch._assert_async(length <= limit, f"The {side} sequence is longer than `max_position_embeddings`")
        return
    if length > limit:
        hint = (f"tokenize with `truncation=True, max_length={limit}`" if side == "source"
                else f"generate at most {limit} tokens (`max_new_tokens`)")
        raise ValueError(f"The {side} sequence has {int(length)} tokens but the model has position embeddings for "
                         f"`max_position_embeddings` = {limit}: {hint}.")


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
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaEncoderOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`), attention_mask (same shape, 1 = token):
            Source tokens and padding mask.
        word_ids, head_word_ids, phrase_ids, phrase_tags, pr_phrase_ids, local_phrase_start, local_phrase_end,
        tree_depth:
            Source syntax fields made by [`MgsaProcessor`] (see `syntax_fields.py` for shapes and padding values).
            Only the fields the configured variant reads are required.
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        check_length(inputs_embeds if input_ids is None else input_ids, 0, self.config.max_position_embeddings,
                     "source")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        hidden_states = inputs_embeds + self.embed_positions(inputs_embeds.shape[:-1])
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

        syntax = MgsaSyntaxInputs.for_batch(
            inputs_embeds,
            attention_mask,
            word_ids=word_ids,
            head_word_ids=head_word_ids,
            phrase_ids=phrase_ids,
            phrase_tags=phrase_tags,
            pr_phrase_ids=pr_phrase_ids,
            local_phrase_start=local_phrase_start,
            local_phrase_end=local_phrase_end,
            tree_depth=tree_depth,
        )
        layer_syntax = variant_inputs(self.config, syntax, hidden_states)
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


def as_encoder_output(encoder_outputs) -> MgsaEncoderOutput:
    """Accept what users and `generate` pass as `encoder_outputs`: our output, a `BaseModelOutput` or a tuple."""
    if isinstance(encoder_outputs, MgsaEncoderOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, BaseModelOutput):
        return MgsaEncoderOutput(**encoder_outputs)
    return MgsaEncoderOutput(
        last_hidden_state=encoder_outputs[0],
        hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
        attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
    )


def encoder_decoder_forward(
    model: PreTrainedModel,
    input_ids: torch.LongTensor | None,
    attention_mask: torch.Tensor | None,
    decoder_input_ids: torch.LongTensor | None,
    decoder_attention_mask: torch.Tensor | None,
    encoder_outputs,
    past_key_values: Cache | None,
    inputs_embeds: torch.Tensor | None,
    decoder_inputs_embeds: torch.Tensor | None,
    use_cache: bool | None,
    syntax_fields: dict[str, torch.LongTensor | None],
    **kwargs: Unpack[TransformersKwargs],
) -> MgsaSeq2SeqModelOutput:
    """
    The encoder-decoder pass of both backbones: encode the source with its syntax fields (unless `encoder_outputs`
    are given, as `generate` does), then decode against the source states and the variant's other source memories
    (PR's phrases).
    """
    past_key_values = resolve_cache(past_key_values, kwargs)
    if encoder_outputs is None:
        encoder_outputs = model.get_encoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            **syntax_fields,
            **kwargs,
        )
    encoder_outputs = as_encoder_output(encoder_outputs)
    decoder_outputs = model.get_decoder()(
        input_ids=decoder_input_ids,
        attention_mask=decoder_attention_mask,
        encoder_hidden_states=encoder_outputs.last_hidden_state,
        encoder_attention_mask=attention_mask,
        past_key_values=past_key_values,
        inputs_embeds=decoder_inputs_embeds,
        use_cache=use_cache,
        **encoder_outputs.source_memories(),
        **kwargs,
    )
    return MgsaSeq2SeqModelOutput(
        last_hidden_state=decoder_outputs.last_hidden_state,
        **{OUTPUT_CACHE_FIELD: getattr(decoder_outputs, OUTPUT_CACHE_FIELD)},
        decoder_hidden_states=decoder_outputs.hidden_states,
        decoder_attentions=decoder_outputs.attentions,
        cross_attentions=decoder_outputs.cross_attentions,
        encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        encoder_hidden_states=encoder_outputs.hidden_states,
        encoder_attentions=encoder_outputs.attentions,
        encoder_tag_loss=encoder_outputs.tag_loss,
        encoder_gates=encoder_outputs.gates,
        encoder_head_labels=encoder_outputs.head_labels,
    )


def check_tag_supervision_inputs(model, labels, phrase_tags, encoder_outputs) -> None:
    """
    MG-SA's tag loss (Eq. 10) needs the batch's `phrase_tags` and a loss computed by the model: a training forward
    that runs the encoder with `labels` but no `phrase_tags` raises, and one without `labels` (a Trainer that
    computes the loss from the logits: `label_smoothing_factor`, `compute_loss_func`) warns once that the loss leaves
    the tag term out. Forwards in eval mode, or on given `encoder_outputs` (as in `generate`), need neither.
    """
    config = model.config
    if not (config.encoder_type == "phrase_memory" and config.phrase_tag_supervision):
        return
    if not model.training or encoder_outputs is not None:
        return
    if labels is not None and phrase_tags is None:
        raise ValueError(
            "`phrase_tag_supervision=True` trains a tag classifier on the batch's `phrase_tags`, which this batch "
            "lacks. Make the batches with the processor of the model's `phrase_levels` (`MgsaProcessor(..., "
            "phrase_levels=config.phrase_levels)`, which returns `phrase_tags` beside `phrase_ids`) and batch them "
            "with `MgsaDataCollator`, or set `phrase_tag_supervision=False`."
        )
    if labels is None and not getattr(model, "tag_loss_added_by_caller", False):
        logger.warning_once(
            "`phrase_tag_supervision=True`, but the model is training without `labels`: the caller computes the "
            "loss from the logits (a Trainer with `label_smoothing_factor` > 0 or `compute_loss_func`), and that loss "
            "leaves out the tag loss (the classifier does not train). Train with `MgsaSeq2SeqTrainer`, which adds it "
            "back, or set the model's `label_smoothing` field instead of the Trainer's `label_smoothing_factor`."
        )


def tag_loss_per_target_token(
    tag_loss: torch.Tensor, labels: torch.LongTensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """
    MG-SA's tag loss on the scale of a translation loss that is a mean over target tokens. Eq. 12 of Hao et al.
    (2019) adds λ · L_tag to the translation log-likelihood, both summed per sentence; the translation loss here is
    that sum over the batch divided by its target tokens (`labels` (B, T), -100 ignored, or `num_items_in_batch`, the
    tokens of the whole accumulated batch), so the tag term is the batch's sum of sentence tag losses (`tag_loss`,
    their mean, times B) over the same count.
    """
    tokens = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
    if torch.is_tensor(tokens):
        tokens = tokens.to(tag_loss.device)
    return tag_loss * labels.shape[0] / tokens


def language_model_output(
    config,
    outputs: MgsaSeq2SeqModelOutput,
    lm_logits: torch.Tensor,
    labels: torch.LongTensor | None,
    output_gates: bool | None,
    output_head_labels: bool | None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> MgsaSeq2SeqLMOutput:
    """
    Both backbones' LM output: the translation cross-entropy of `lm_logits` (B, T, V) against `labels` (B, T) (-100
    ignored), label-smoothed by `config.label_smoothing` as the Trainer's `LabelSmoother` does, plus
    `phrase_tag_loss_weight` times MG-SA's tag loss (Eq. 10, per target token: [`tag_loss_per_target_token`]), and the
    analysis outputs that were asked for.

    Without `num_items_in_batch` the translation loss is the mean over the batch's target tokens. The Trainer passes
    the number of target tokens of the whole accumulated batch (over its processes) as `num_items_in_batch`: then
    both terms are this batch's sums over that number, so that the accumulated loss is the whole batch's.
    """
    translation_loss = loss = None
    tag_loss = outputs.encoder_tag_loss.mean() if outputs.encoder_tag_loss is not None else None
    if labels is not None:
        # label smoothing (Szegedy et al., 2016; Vaswani et al., 2017 §5.4): (1 - ε) NLL + ε · mean_v(-log p_v)
        translation_loss = nn.functional.cross_entropy(
            lm_logits.view(-1, lm_logits.shape[-1]), labels.view(-1), ignore_index=-100,
            label_smoothing=config.label_smoothing, reduction="mean" if num_items_in_batch is None else "sum",
        )
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(translation_loss.device)
            translation_loss = translation_loss / num_items_in_batch
        loss = translation_loss
        if tag_loss is not None:
            loss = loss + config.phrase_tag_loss_weight * tag_loss_per_target_token(tag_loss, labels,
                                                                                     num_items_in_batch)
    return MgsaSeq2SeqLMOutput(
        loss=loss,
        logits=lm_logits,
        **{OUTPUT_CACHE_FIELD: getattr(outputs, OUTPUT_CACHE_FIELD)},
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
        translation_loss=translation_loss,
        tag_loss=tag_loss,
        encoder_gates=outputs.encoder_gates if output_gates else None,
        encoder_head_labels=outputs.encoder_head_labels if output_head_labels else None,
    )


class MgsaModel(MgsaPreTrainedModel):
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

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        phrase_tags: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaSeq2SeqModelOutput:
        r"""
        Arguments are those of [`~transformers.MarianModel`] plus the source syntax fields of [`MgsaEncoder`].
        """
        syntax_fields = source_syntax_fields(
            word_ids, head_word_ids, phrase_ids, phrase_tags, pr_phrase_ids, local_phrase_start, local_phrase_end,
            tree_depth,
        )
        return encoder_decoder_forward(
            self,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs,
            past_key_values,
            inputs_embeds,
            decoder_inputs_embeds,
            use_cache,
            syntax_fields,
            **kwargs,
        )


class BaseModelAutoMapMixin:
    """Saving a translation model with its code (`register_for_auto_class`, which importing the package does) also
    names its bare encoder-decoder (`base_model_class`) under `AutoModel` in the config's `auto_map`, and the
    translation pipeline under `mgsa-translation` in `custom_pipelines`, so that `AutoModel.from_pretrained(folder,
    trust_remote_code=True)` and `pipeline(model=folder, trust_remote_code=True)` work where this package is not
    installed. `save_pretrained` writes only the saved class's own Auto entry and the code its module imports:
    importing the pipeline here makes it one of those files, so every save (`Trainer.save_model`, `push_to_hub`)
    writes it."""

    base_model_class: type

    def save_pretrained(self, save_directory, *args, **kwargs):
        if self._auto_class is not None:
            from .pipeline_translation import remote_pipelines

            base = self.base_model_class
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                    "AutoModel": f"{base.__module__.rsplit('.', 1)[-1]}.{base.__name__}"}
            self.config.custom_pipelines = {**(getattr(self.config, "custom_pipelines", None) or {}),
                                            **remote_pipelines()}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(self, repo_id: str, *args, **kwargs):
        """
        Transformers' `push_to_hub`, which keeps the card a repository has and gives a new one its blank template:
        a model loaded from a folder that holds this package's model card (`README.md` tagged `mgsa-hf`, with the
        scores as `model-index`, as `mgsa-hf train` writes it) gives a repository without a card that card first.
        """
        card_path = Path(str(self.name_or_path)) / "README.md"
        if card_path.is_file() and "mgsa-hf" in (ModelCard.load(card_path).data.tags or []):
            api = HfApi(token=kwargs.get("token"))
            repo_id = api.create_repo(repo_id, private=kwargs.get("private"), exist_ok=True).repo_id
            try:
                ModelCard.load(repo_id, token=kwargs.get("token"))
            except EntryNotFoundError:
                api.upload_file(path_or_fileobj=str(card_path), path_in_repo="README.md", repo_id=repo_id,
                                commit_message="Add the model card")
        return super().push_to_hub(repo_id, *args, **kwargs)


class MgsaForConditionalGeneration(
    BaseModelAutoMapMixin, MgsaPreTrainedModel, CheckedGenerationMixin, GenerationMixin
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

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        phrase_tags: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
        output_gates: bool | None = None,
        output_head_labels: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MgsaSeq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_len)`, *optional*):
            Target token ids; -100 is ignored. The decoder inputs are the labels shifted right.
        output_gates (`bool`, *optional*):
            Return the hybrid encoder's local/global gates as `encoder_gates`.
        output_head_labels (`bool`, *optional*):
            Return RHE's important (1) / redundant (0) head labels as `encoder_head_labels`.

        The other arguments are those of [`~transformers.MarianMTModel`] and the source syntax fields of
        [`MgsaEncoder`].
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        check_tag_supervision_inputs(self, labels, phrase_tags, encoder_outputs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        syntax_fields = source_syntax_fields(
            word_ids, head_word_ids, phrase_ids, phrase_tags, pr_phrase_ids, local_phrase_start, local_phrase_end,
            tree_depth,
        )
        outputs = encoder_decoder_forward(
            self.model,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs,
            past_key_values,
            inputs_embeds,
            decoder_inputs_embeds,
            use_cache,
            syntax_fields,
            **kwargs,
        )
        lm_logits = self.lm_head(outputs.last_hidden_state) + self.final_logits_bias
        return language_model_output(self.config, outputs, lm_logits, labels, output_gates, output_head_labels,
                                     num_items_in_batch)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
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
