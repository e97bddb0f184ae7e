"""What both backbones (`modeling_mgsa.py`, Marian; `modeling_mgsa_t5.py`, T5) share in their forward: the
encoder-decoder pass, the language-model output and its loss, gradient checkpointing that reaches every tensor, the
decoder cache's name, and saving with the code (`BaseModelAutoMapMixin`).

The rest of what they share lives beside it, one concern a module:

* `modeling_variant.py`: [`Variant`], what one encoder variant adds (each variant module defines one; `variants.py`
  registers them);
* `modeling_syntax_inputs.py`: [`MgsaSyntaxInputs`], the source syntax of one forward pass;
* `modeling_attention.py`: [`MgsaAttention`], the one multi-head attention core every variant extends;
* `modeling_outputs_mgsa.py`: [`MgsaLayerOutput`] and the model outputs;
* `modeling_loss.py`: the label-smoothed translation loss plus MG-SA's tag loss;
* `modeling_upgrade.py`: the upgrade of a checkpoint that lacks the variant's modules.
"""

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import can_return_tuple

from .modeling_loss import check_tag_supervision_inputs, translation_loss, with_tag_loss
from .modeling_outputs_mgsa import (
    OUTPUT_CACHE_FIELD,
    SEQ2SEQ_ENCODER_FIELDS,
    MgsaEncoderOutput,
    MgsaLayerOutput,
    MgsaSeq2SeqLMOutput,
    MgsaSeq2SeqModelOutput,
)
from .modeling_syntax_inputs import MgsaSyntaxInputs


def resolve_cache(past_key_values: Cache | None, kwargs: dict) -> Cache | None:
    """The decoder cache of a forward call: transformers >= 5.24 names it `cache` (and `generate` passes it so), the
    earlier versions `past_key_values`; `cache` is taken out of `kwargs` so that it reaches no layer as a stray
    keyword."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the decoder cache as `cache` or as `past_key_values`, not both.")
    return cache if cache is not None else past_key_values

def checkpoint_layer(checkpoint: Callable, layer_call: Callable, *args):
    """
    `checkpoint(layer_call, *args)` (torch's checkpoint with the model's settings) such that every tensor a layer reads
    or returns gets its gradient, with reentrant checkpointing (`use_reentrant=True`) too. That kind only reaches the
    tensors passed and returned at the top level: a keyword tensor that requires grad (T5's position bias, PR's source
    phrases) would be recomputed against the graph outside the layer, whose backward then runs once per layer
    ("Trying to backward through the graph a second time"), and the tensors inside a layer's [`MgsaLayerOutput`]
    (MG-SA's tag loss, PR's phrases), computed without grad, would get none. So the keyword tensors of `layer_call` (a
    `functools.partial`, as `GradientCheckpointingLayer` makes it) go in positionally, and the layer's contribution
    (and the tensors after it: T5's position bias) comes out as a flat tuple.
    """
    if not isinstance(layer_call, partial):
        return checkpoint(layer_call, *args)
    keywords = dict(layer_call.keywords)
    tensor_names = [name for name, value in keywords.items() if isinstance(value, torch.Tensor)]
    passed_on = None  # with a contribution: how many outputs follow it

    def run(*inputs):
        nonlocal passed_on
        layer_args, tensors = inputs[: len(args)], inputs[len(args) :]
        layer_keywords = {**keywords, **dict(zip(tensor_names, tensors, strict=True))}
        output = layer_call.func(*layer_call.args, *layer_args, **layer_keywords)
        if isinstance(output, tuple) and len(output) >= 2 and isinstance(output[1], MgsaLayerOutput):
            passed_on = len(output) - 2
        return output if passed_on is None else (output[0], *output[2:], *output[1].to_tuple())

    output = checkpoint(run, *args, *(keywords[name] for name in tensor_names))
    if passed_on is not None:  # (hidden_states, *rest, *contribution) -> (hidden_states, MgsaLayerOutput, *rest)
        return output[0], MgsaLayerOutput.from_tuple(output[1 + passed_on :]), *output[1 : 1 + passed_on]
    return output


class MgsaCheckpointingLayer(GradientCheckpointingLayer):
    """A `GradientCheckpointingLayer` that checkpoints through [`checkpoint_layer`], so that reentrant checkpointing
    gives the same gradients as the non-reentrant kind (and as no checkpointing)."""

    @property
    def _gradient_checkpointing_func(self) -> Callable:
        return partial(checkpoint_layer, self._checkpoint_func)

    @_gradient_checkpointing_func.setter
    def _gradient_checkpointing_func(self, checkpoint: Callable) -> None:
        # what `gradient_checkpointing_enable` sets: torch's checkpoint with the model's settings
        self._checkpoint_func = checkpoint


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
    syntax: MgsaSyntaxInputs,
    **kwargs: Unpack[TransformersKwargs],
) -> MgsaSeq2SeqModelOutput:
    """
    The encoder-decoder pass of both backbones: encode the source with its `syntax` (unless `encoder_outputs` are
    given, as `generate` does), then decode against the source states and the variant's other source memories (PR's
    phrases).
    """
    past_key_values = resolve_cache(past_key_values, kwargs)
    if encoder_outputs is None:
        encoder_outputs = model.get_encoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            syntax=syntax,
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
        **{f"encoder_{name}": getattr(encoder_outputs, name) for name in SEQ2SEQ_ENCODER_FIELDS},
    )


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
    Both backbones' LM output: the translation loss of `lm_logits` (B, T, V) against `labels` (B, T)
    ([`translation_loss`] with `config.label_smoothing`) plus `phrase_tag_loss_weight` times MG-SA's tag loss (Eq. 10
    on the translation loss's scale, [`with_tag_loss`]), and the analysis outputs that were asked for.

    Without `num_items_in_batch` the translation loss is the mean over the batch's target tokens. The Trainer passes
    the number of target tokens of the whole accumulated batch (over its processes) as `num_items_in_batch`: then
    both terms are this batch's sums over that number, so that the accumulated loss is the whole batch's.
    """
    translation = loss = None
    tag_loss = outputs.encoder_tag_loss.mean() if outputs.encoder_tag_loss is not None else None
    if labels is not None:
        translation = translation_loss(lm_logits, labels, config.label_smoothing, num_items_in_batch)
        loss = with_tag_loss(translation, tag_loss, config.phrase_tag_loss_weight, labels, num_items_in_batch)
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
        translation_loss=translation,
        tag_loss=tag_loss,
        encoder_gates=outputs.encoder_gates if output_gates else None,
        encoder_head_labels=outputs.encoder_head_labels if output_head_labels else None,
    )


class MgsaSeq2SeqModelMixin:
    """The forward of both backbones' bare encoder-decoders ([`MgsaModel`], [`MgsaT5Model`])."""

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
        Arguments are those of the backbone's bare model ([`~transformers.MarianModel`], [`~transformers.T5Model`])
        plus the source syntax fields of its encoder.
        """
        syntax = MgsaSyntaxInputs.pack(locals())
        return encoder_decoder_forward(
            self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, encoder_outputs,
            past_key_values, inputs_embeds, decoder_inputs_embeds, use_cache, syntax, **kwargs,
        )


class MgsaForConditionalGenerationMixin:
    """
    The forward of both backbones' translation models ([`MgsaForConditionalGeneration`],
    [`MgsaT5ForConditionalGeneration`]): decoder inputs from the labels (`prepare_decoder_input_ids_from_labels`),
    the encoder-decoder pass, the backbone's language-model head (`language_model_logits`) and the loss.
    """

    def language_model_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The backbone's vocabulary logits (B, T, V) of the decoder's last states (B, T, D)."""
        raise NotImplementedError

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

        The other arguments are those of the backbone's translation model ([`~transformers.MarianMTModel`],
        [`~transformers.T5ForConditionalGeneration`]) and the source syntax fields of its encoder.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        check_tag_supervision_inputs(self, labels, phrase_tags, encoder_outputs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        syntax = MgsaSyntaxInputs.pack(locals())
        outputs = encoder_decoder_forward(
            self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, encoder_outputs,
            past_key_values, inputs_embeds, decoder_inputs_embeds, use_cache, syntax, **kwargs,
        )
        lm_logits = self.language_model_logits(outputs.last_hidden_state)
        return language_model_output(self.config, outputs, lm_logits, labels, output_gates, output_head_labels,
                                     num_items_in_batch)


# the repository id a model card names before the folder is published (`mgsa-hf train` without `push_to_hub`):
# `<your-username>/<folder name>`, which `push_to_hub` replaces by the repository's id
REPO_ID_PLACEHOLDER = "<your-username>/"
# the card's note asking to replace it, between these markers
PLACEHOLDER_NOTE = ("<!-- repo-id-note -->", "<!-- /repo-id-note -->")


def card_for_repository(card_text: str, repo_id: str) -> str:
    """A model card written before its folder was published (naming `<your-username>/<name>`), for the repository
    `repo_id`: every placeholder id replaced by `repo_id`, and the note asking to replace it dropped."""
    start, end = PLACEHOLDER_NOTE
    if start in card_text and end in card_text:
        card_text = card_text[: card_text.index(start)] + card_text[card_text.index(end) + len(end) :].lstrip("\n")
    return re.sub(re.escape(REPO_ID_PLACEHOLDER) + r"[\w.\-]+", repo_id, card_text)


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
        scores as `model-index`, as `mgsa-hf train` writes it) gives a repository without a card that card first,
        naming the repository ([`card_for_repository`]).
        """
        card_path = Path(str(self.name_or_path)) / "README.md"
        if card_path.is_file() and "mgsa-hf" in (ModelCard.load(card_path).data.tags or []):
            api = HfApi(token=kwargs.get("token"))
            repo_id = api.create_repo(repo_id, private=kwargs.get("private"), exist_ok=True).repo_id
            try:
                ModelCard.load(repo_id, token=kwargs.get("token"))
            except EntryNotFoundError:
                card = card_for_repository(card_path.read_text(encoding="utf-8"), repo_id)
                api.upload_file(path_or_fileobj=card.encode("utf-8"), path_in_repo="README.md", repo_id=repo_id,
                                commit_message="Add the model card")
        return super().push_to_hub(repo_id, *args, **kwargs)
