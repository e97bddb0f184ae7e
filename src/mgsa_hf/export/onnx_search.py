"""Generation as one onnxruntime call: the search runs inside the graph.

[`export_search_onnx`] writes a saved MGSA model (or a model object; Marian or T5 backbone, every encoder type) to a
folder holding `search_model.onnx`: one graph whose node is onnxruntime's contrib `BeamSearch` (domain
`com.microsoft`, encoder-decoder form, as `onnxruntime.transformers` builds it for T5) over two subgraphs:

- the encoder with the first decoding step: `encoder_input_ids`, `encoder_attention_mask`, `decoder_input_ids`
  `(batch, 1)` (int32) → `logits` `(batch, 1, vocab_size)`, `encoder_hidden_states`, `present_key_self_{i}` /
  `present_value_self_{i}` and `present_key_cross_{i}` / `present_value_cross_{i}`;
- every later step: `input_ids` `(batch, 1)`, `encoder_attention_mask` (int32), `encoder_hidden_states` and the
  caches → `logits` and the self-attention caches one position longer. The step's position follows the cache
  length: Marian's position embedding, T5's decoder relative position bias. Marian's embedding scale and
  `final_logits_bias`, T5's d_model^-0.5 scale of a tied head, are inside; T5 starts from its pad token.

The op passes its encoder subgraph only those three inputs. The source syntax fields that the encoder type reads
([`~mgsa_hf.export.onnx_syntax_fields`]: syntactic MG-SA's `phrase_ids` `(batch, levels, source_len)`, RHE's
`(batch, source_len)` fields) are inputs of the main graph (int64), which the encoder subgraph reads from the
enclosing scope: the op passes a subgraph the outer values it reads (its implicit inputs). The encoder subgraph runs
once per sentence, before the op copies its outputs per beam, so the fields keep the sentences' batch.

The op carries one key and one value per decoder layer from the encoder subgraph to the decoder one, and checks that
count. PR's decoder also reads phrase keys and values and the phrase mask: they ride in the token cross caches
([`pack_phrase_caches`]), and the decoder subgraph splits them at the source length.

The weights live once, in the main graph. The search settings come from the model's generation config: `num_beams`,
`max_length`, `min_length`, `length_penalty`, `no_repeat_ngram_size`, `num_return_sequences`, the decoder start, pad
and EOS ids, `forced_eos_token_id` (in the subgraphs) and the tokens that `bad_words_ids` (single tokens) and
`suppress_tokens` forbid (the op's vocabulary mask). One beam is greedy search. Settings the op cannot reproduce are
refused by name ([`check_search_settings`]); beam search needs `early_stopping=True` and a forced EOS
([`BEAM_SEARCH_LIMITS`]), which a T5 model's generation config does not set by default.

[`OrtSearchModel`] runs the folder: `generate(input_ids, attention_mask, num_beams=..., max_new_tokens=...)`, with
the processor's syntax fields for a type that reads them, returns the token ids that the PyTorch model's `generate`
returns.

This module is a tool: the model's own modules never import it. It needs the `export` extra (onnx, onnxscript,
onnxruntime).
"""

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, GenerationConfig
from transformers.processing_utils import ProcessorMixin
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ..input_checks import check_token_ids
from ..modeling_common import check_length
from . import EXPORTABLE_SYNTAX_FIELDS, ONNX_FOLDER_FILES, check_onnx_exportable, export_folder, onnx_syntax_fields
from .onnx_generation import (
    EXAMPLES,
    DecoderGraph,
    EncoderGraph,
    cpu_session_options,
    load_model_and_processor,
    trace_to_onnx,
)
from .onnx_record import verify_onnx_record, weights_digest, write_onnx_record


if TYPE_CHECKING:
    import onnxruntime

# the onnxruntime release the search graph is tested with: 1.20 refuses to load it (its subgraphs read the main
# graph's `max_length`, which that release's graph check does not type: "does not have type information set by parent
# node"); releases between are untested
SEARCH_ONNXRUNTIME = (1, 32)
SEARCH_GRAPH = "search_model.onnx"
SEARCH_MANIFEST = "onnx_search.json"
SEARCH_FOLDER_FILES = (SEARCH_GRAPH, SEARCH_MANIFEST, *ONNX_FOLDER_FILES)
CONTRIB_DOMAIN = "com.microsoft"
# the fields of a processor batch that `generate` takes: the syntax fields an encoder reads are passed on, the others
# ignored
PROCESSOR_FIELDS = (*EXPORTABLE_SYNTAX_FIELDS, "phrase_tags", "token_type_ids")

# generation-config fields the op reproduces, and each one's value when it is not set
SUPPORTED_DEFAULTS = {
    "num_beams": 1, "max_length": 20, "min_length": 0, "length_penalty": 1.0, "early_stopping": False,
    "no_repeat_ngram_size": 0, "num_return_sequences": 1,
}
# fields that change nothing when they hold these values
NEUTRAL_VALUES = {
    "do_sample": (None, False), "num_beam_groups": (None, 1), "diversity_penalty": (None, 0.0),
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "forced_bos_token_id": (None,),
    "exponential_decay_length_penalty": (None,), "min_new_tokens": (None, 0),
    "renormalize_logits": (None, False), "sequence_bias": (None,), "begin_suppress_tokens": (None, []),
    "encoder_no_repeat_ngram_size": (None, 0), "constraints": (None,), "force_words_ids": (None,),
    "guidance_scale": (None, 1.0), "remove_invalid_values": (None, False), "penalty_alpha": (None,),
    "dola_layers": (None,), "watermarking_config": (None,), "stop_strings": (None,), "max_time": (None,),
    "token_healing": (None, False), "low_memory": (None, False),
}


# why beam search needs `early_stopping=True` and a forced EOS (measured: with `early_stopping=False`, 41 of 96
# batched `generate` calls on test 2016 gave other tokens; without the forced EOS, 65 of 96)
BEAM_SEARCH_LIMITS = (
    "onnxruntime's BeamSearch reproduces transformers' beam search only with early_stopping=True and "
    "forced_eos_token_id equal to eos_token_id: with early_stopping=False it decides that a sentence is done by "
    "another rule (against the best candidate, EOS ones included, not the best running beam), and a hypothesis that "
    "reaches max_length without EOS is scored over one more token and may be one ranked below num_beams"
)


def check_search_onnxruntime(version: str) -> None:
    """Refuse an onnxruntime `version` older than [`SEARCH_ONNXRUNTIME`], naming it and the one to install."""
    release = tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())
    if release < SEARCH_ONNXRUNTIME:
        wanted = ".".join(map(str, SEARCH_ONNXRUNTIME))
        raise RuntimeError(f"the one-call search needs onnxruntime>={wanted} (this is {version}, which cannot load "
                           f"its graph): `pip install 'onnxruntime>={wanted}'`, or run the folder of "
                           "`export_generation_onnx` (`mgsa-hf export onnx`) with OrtMgsaForConditionalGeneration.")


def check_search_settings(generation_config: GenerationConfig, where: str = "generation_config") -> dict:
    """
    The search settings of `generation_config` as the op takes them, or a `ValueError` naming every setting it
    cannot reproduce: sampling, group beam search, repetition and exponential length penalties, a forced BOS,
    multi-token `bad_words_ids`, several EOS ids, the other logits processors, and beam search (`num_beams` > 1)
    without `early_stopping=True` and `forced_eos_token_id=eos_token_id` ([`BEAM_SEARCH_LIMITS`]).

    Returns:
        `num_beams`, `max_length`, `min_length`, `length_penalty`, `early_stopping`, `no_repeat_ngram_size`,
        `num_return_sequences`, `beam_search` (whether beams reproduce `generate`), `eos_token_id`,
        `forced_eos_token_id`, `pad_token_id`, `decoder_start_token_id` and `masked_tokens` (forbidden token ids).
    """
    values = generation_config.to_dict()
    refused = [f"{where}.{name}={values.get(name)!r}" for name, neutral in NEUTRAL_VALUES.items()
               if values.get(name) not in neutral]
    settings = {name: default if values.get(name) is None else values[name]
                for name, default in SUPPORTED_DEFAULTS.items()}
    masked = set(values.get("suppress_tokens") or [])
    for words in values.get("bad_words_ids") or []:
        if len(words) != 1:
            refused.append(f"{where}.bad_words_ids entry {words} (the op masks single tokens)")
        masked.update(words)
    eos = values.get("eos_token_id")
    if isinstance(eos, list):
        if len(eos) != 1:
            refused.append(f"{where}.eos_token_id={eos} (the op takes one EOS id)")
        eos = eos[0] if eos else None
    for name, value in (("eos_token_id", eos), ("pad_token_id", values.get("pad_token_id")),
                        ("decoder_start_token_id", values.get("decoder_start_token_id"))):
        if value is None:
            refused.append(f"{where}.{name} is not set")
    forced_eos = values.get("forced_eos_token_id")
    if isinstance(forced_eos, list):
        if len(forced_eos) != 1:
            refused.append(f"{where}.forced_eos_token_id={forced_eos} (one forced EOS id is supported)")
        forced_eos = forced_eos[0] if forced_eos else None
    beam_search = settings["early_stopping"] is True and forced_eos is not None and forced_eos == eos
    if settings["num_beams"] > 1 and not beam_search:
        refused.append(f"{where}.num_beams={settings['num_beams']} with early_stopping={settings['early_stopping']!r}"
                       f" and forced_eos_token_id={forced_eos!r} ({BEAM_SEARCH_LIMITS})")
    if refused:
        raise ValueError("The one-call ONNX search cannot reproduce these generation settings: "
                         + "; ".join(refused) + ". Export without them, or serve with `export_generation_onnx`.")
    return {**settings, "beam_search": beam_search, "eos_token_id": eos, "forced_eos_token_id": forced_eos,
            "pad_token_id": values["pad_token_id"], "decoder_start_token_id": values["decoder_start_token_id"],
            "masked_tokens": sorted(masked)}


# PR's decoder memories beside the source states: the phrase states and their mask
PHRASE_MEMORIES = ["encoder_hidden_states", "encoder_phrase_states", "encoder_phrase_mask"]


def pack_phrase_caches(caches: list[torch.Tensor], attention_mask, phrase_mask, num_layers: int) -> list:
    """PR's cross caches as the op carries them: it takes one key and one value per decoder layer from the encoder
    subgraph to the decoder one (`encoder_subgraph_.num_layers == decoder_subgraph_.num_layers`,
    beam_search_impl_t5.h). Each layer's phrase key or value `(batch, heads, num_phrases, head_dim)` follows its
    token one `(batch, heads, source_len, head_dim)` on the length axis, and the first key has one more channel: the
    source mask then the phrase mask, as floats. [`unpack_phrase_caches`] undoes it."""
    tokens, phrases = caches[: 2 * num_layers], caches[2 * num_layers:]
    packed = [torch.cat([token, phrase], dim=2) for token, phrase in zip(tokens, phrases, strict=True)]
    key = packed[0]
    masks = torch.cat([attention_mask, phrase_mask], dim=1).to(key.dtype)
    packed[0] = torch.cat([key, masks[:, None, :, None].expand(-1, key.shape[1], -1, 1)], dim=3)
    return packed


def unpack_phrase_caches(packed: tuple, source_len: int, d_model: int) -> tuple[list, torch.Tensor, torch.Tensor]:
    """`(cross_caches, phrase_states, phrase_mask)` from [`pack_phrase_caches`]' tensors: the token caches, then
    the phrase ones, as the decoder's cache holds them; zero phrase states `(batch, 1, num_phrases, d_model)` (with
    the phrase keys and values cached, the decoder reads only their shape) and the mask `(batch, num_phrases)`."""
    head_dim = packed[1].shape[3]
    first = packed[0]
    phrase_mask = first[:, 0, source_len:, head_dim] > 0.5
    caches = [first[..., :head_dim], *packed[1:]]
    token_caches = [cache[:, :, :source_len] for cache in caches]
    phrase_caches = [cache[:, :, source_len:] for cache in caches]
    phrase_states = first.new_zeros(first.shape[0], 1, phrase_mask.shape[1], d_model)
    return [*token_caches, *phrase_caches], phrase_states, phrase_mask


class SearchEncoderGraph(nn.Module):
    """The op's encoder subgraph: the encoder and the first decoding step. Inputs are int32, `(batch, source_len)`
    and `(batch, 1)`, then the syntax fields `syntax_names` (int64, read from the main graph); outputs the logits
    `(batch, 1, vocab_size)`, the source states `(batch, source_len, d_model)`, the self-attention caches
    `(batch, heads, 1, head_dim)` and the cross-attention ones `(batch, heads, source_len, head_dim)` (PR: with the
    phrase ones and masks, [`pack_phrase_caches`])."""

    def __init__(self, model: nn.Module, num_layers: int, syntax_names: tuple[str, ...] = (), phrases: bool = False):
        super().__init__()
        self.encoder = EncoderGraph(model)
        memories = PHRASE_MEMORIES if phrases else PHRASE_MEMORIES[:1]
        self.first_step = DecoderGraph(model, memories, num_layers, 0, with_past=False)
        self.syntax_names, self.phrases, self.num_layers = syntax_names, phrases, num_layers

    def forward(self, encoder_input_ids, encoder_attention_mask, *tensors):
        """The source `(batch, source_len)`, then in `tensors` `decoder_input_ids` `(batch, 1)` (the decoder start)
        and the syntax fields (varargs, as the exporter traces them) → `(logits, encoder_hidden_states,
        *self_caches, *cross_caches)`."""
        mask = encoder_attention_mask.long()
        syntax = dict(zip(self.syntax_names, tensors[1:], strict=True))
        memories = self.encoder(encoder_input_ids.long(), mask, **syntax)
        logits, *caches = self.first_step(tensors[0].long(), mask, *memories)
        if self.phrases:
            self_caches, cross_caches = caches[: 2 * self.num_layers], caches[2 * self.num_layers:]
            caches = [*self_caches, *pack_phrase_caches(cross_caches, mask, memories[2], self.num_layers)]
        return logits[:, None], memories[0], *caches


class SearchDecoderGraph(nn.Module):
    """The op's decoder subgraph: one step after the first, `input_ids` `(batch, 1)` and `encoder_attention_mask`
    (int32), the source states and the caches in (PR: the cross caches packed, [`pack_phrase_caches`]); the logits
    `(batch, 1, vocab_size)` and the self-attention caches one position longer out."""

    def __init__(self, model: nn.Module, num_layers: int, phrases: bool = False):
        super().__init__()
        memories = PHRASE_MEMORIES if phrases else PHRASE_MEMORIES[:1]
        self.step = DecoderGraph(model, memories, num_layers, 2 * num_layers if phrases else num_layers,
                                 with_past=True)
        self.num_layers, self.phrases, self.d_model = num_layers, phrases, model.config.d_model

    def forward(self, input_ids, encoder_attention_mask, *tensors):
        """`tensors`: the source states, then every layer's self-attention and cross-attention key and value;
        returns `(logits, *self_caches)`."""
        if self.phrases:
            hidden_states, self_caches = tensors[0], tensors[1: 1 + 2 * self.num_layers]
            cross_caches, phrase_states, phrase_mask = unpack_phrase_caches(
                tensors[1 + 2 * self.num_layers:], encoder_attention_mask.shape[1], self.d_model)
            tensors = (hidden_states, phrase_states, phrase_mask, *self_caches, *cross_caches)
        logits, *caches = self.step(input_ids.long(), encoder_attention_mask.long(), *tensors)
        return logits[:, None], *caches


def _cache_names(kind: str, side: str, count: int) -> list[str]:
    """onnxruntime's names: `{kind}_key_{side}_{i}`, `{kind}_value_{side}_{i}` for `count` layers."""
    return [f"{kind}_{part}_{side}_{i}" for i in range(count) for part in ("key", "value")]


def _export_subgraphs(model, batch: dict, syntax_names: tuple[str, ...], folder: Path, opset):
    """Trace both subgraphs on a processor `batch`; return the two ONNX models. The encoder subgraph reads the
    syntax fields `syntax_names` from the main graph (its inputs of these names), not as inputs of its own."""
    import onnx

    config = model.config
    num_layers = config.decoder_layers if hasattr(config, "decoder_layers") else config.num_decoder_layers
    phrases = config.encoder_type == "phrase_representation"
    batch_dim, source = torch.export.Dim("batch"), torch.export.Dim("source_length")
    ids, mask = batch["input_ids"].int(), batch["attention_mask"].int()
    syntax = [torch.as_tensor(batch[name]).long() for name in syntax_names]
    syntax_shapes = [{0: batch_dim, 2 if name == "phrase_ids" else 1: source} for name in syntax_names]
    start = torch.full((ids.shape[0], 1), config.decoder_start_token_id, dtype=torch.int32)
    encoder = SearchEncoderGraph(model, num_layers, syntax_names, phrases).eval()
    with torch.no_grad():
        first = encoder(ids, mask, start, *syntax)
    self_names = _cache_names("present", "self", num_layers)
    cross_names = _cache_names("present", "cross", num_layers)
    trace_to_onnx(encoder, (ids, mask, start, *syntax),
                 [{0: batch_dim, 1: source}, {0: batch_dim, 1: source}, {0: batch_dim}, *syntax_shapes],
                 ["encoder_input_ids", "encoder_attention_mask", "decoder_input_ids", *syntax_names],
                 ["logits", "encoder_hidden_states", *self_names, *cross_names], folder / "encoder.onnx", opset)
    past = torch.export.Dim("past_length")
    # PR's cross caches run over the source and its phrases: their length is a dimension of its own
    memory = torch.export.Dim("memory_length") if phrases else source
    hidden_states, caches = first[1], first[2:]
    self_past, cross_past = caches[: 2 * num_layers], caches[2 * num_layers:]
    decoder = SearchDecoderGraph(model, num_layers, phrases).eval()
    next_token = torch.full((ids.shape[0], 1), 5, dtype=torch.int32)
    trace_to_onnx(decoder, (next_token, mask, hidden_states, *self_past, *cross_past),
                 [{0: batch_dim}, {0: batch_dim, 1: source}, {0: batch_dim, 1: source},
                  *[{0: batch_dim, 2: past}] * len(self_past), *[{0: batch_dim, 2: memory}] * len(cross_past)],
                 ["input_ids", "encoder_attention_mask", "encoder_hidden_states",
                  *_cache_names("past", "self", num_layers), *_cache_names("past", "cross", num_layers)],
                 ["logits", *self_names], folder / "decoder.onnx", opset)
    encoder_model = onnx.load(folder / "encoder.onnx")
    # the op passes its encoder three inputs: the syntax fields come from the main graph's scope (implicit inputs)
    kept = [value for value in encoder_model.graph.input if value.name not in syntax_names]
    del encoder_model.graph.input[:]
    encoder_model.graph.input.extend(kept)
    return encoder_model, onnx.load(folder / "decoder.onnx")


def _nested_graphs(graph) -> list:
    """The graphs nested in `graph`'s nodes (If and Scan bodies), at any depth."""
    import onnx

    nested = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                nested += [attribute.g, *_nested_graphs(attribute.g)]
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for body in attribute.graphs:
                    nested += [body, *_nested_graphs(body)]
    return nested


def _share_initializers(subgraphs: list, shared: dict) -> list:
    """Move the weights of `subgraphs` to the main graph, one initializer per distinct tensor (the encoder and
    decoder subgraphs hold the decoder's weights each), renamed in the nodes that read them. `shared` maps a
    tensor's digest to its new name; returns the initializers to add to the main graph."""
    from onnx import numpy_helper

    moved = []
    for graph in subgraphs:
        renames = {}
        for tensor in graph.initializer:
            array = numpy_helper.to_array(tensor)
            digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()
            if digest not in shared:
                shared[digest] = f"shared_weight_{len(shared)}"
                copy = type(tensor)()
                copy.CopyFrom(tensor)
                copy.name = shared[digest]
                moved.append(copy)
            renames[tensor.name] = shared[digest]
        graph.ClearField("initializer")
        for body in [graph, *_nested_graphs(graph)]:
            for node in body.node:
                node.input[:] = [renames.get(name, name) for name in node.input]
            for output in body.output:  # a graph output that is a weight: through an Identity
                if output.name in renames:
                    raise ValueError(f"The subgraph output {output.name} is a constant: not supported.")
    return moved


def _force_eos_at_last_step(graph, eos_token_id: int, vocab_size: int, first_step: bool) -> None:
    """`forced_eos_token_id`, in a subgraph: the step whose token would be the last one that `max_length` (the main
    graph's input) allows gets logits that are -inf but at EOS, as transformers' `ForcedEOSTokenLogitsProcessor`
    leaves the scores. The step's position is 1 for the first, the self-attention cache length + 1 after."""
    from onnx import helper, numpy_helper

    producer = next(node for node in graph.node if "logits" in node.output)
    producer.output[list(producer.output).index("logits")] = "forced_eos_unforced_logits"
    forced = np.full((1, 1, vocab_size), -np.inf, dtype=np.float32)
    forced[..., eos_token_id] = 0.0
    graph.initializer.extend([numpy_helper.from_array(forced, "forced_eos_logits"),
                              numpy_helper.from_array(np.array([1], dtype=np.int64), "forced_eos_one")])
    if first_step:
        position = [helper.make_node("Identity", ["forced_eos_one"], ["forced_eos_position"])]
    else:
        position = [helper.make_node("Shape", ["past_key_self_0"], ["forced_eos_past"], start=2, end=3),
                    helper.make_node("Add", ["forced_eos_past", "forced_eos_one"], ["forced_eos_position"])]
    graph.node.extend([
        *position,
        helper.make_node("Cast", ["max_length"], ["forced_eos_max_length"], to=7),  # int64
        helper.make_node("Sub", ["forced_eos_max_length", "forced_eos_one"], ["forced_eos_last"]),
        helper.make_node("Equal", ["forced_eos_position", "forced_eos_last"], ["forced_eos_now"]),
        helper.make_node("Where", ["forced_eos_now", "forced_eos_logits", "forced_eos_unforced_logits"], ["logits"]),
    ])


def _search_node(settings: dict, encoder, decoder, vocab_mask: bool):
    """The `BeamSearch` node over `encoder` and `decoder`, reading the main graph's inputs. It stops a sentence at
    its `num_beams`-th finished hypothesis (`early_stopping=True`); with one beam, that is greedy search."""
    import onnx

    inputs = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences", "length_penalty",
              "repetition_penalty", "vocab_mask" if vocab_mask else "", "", "attention_mask"]
    # the rows of finished hypotheses are filled with EOS, not padding: a generated padding token stays apart from
    # the fill ([`OrtSearchModel._as_generate_returns`])
    attributes = dict(eos_token_id=settings["eos_token_id"], pad_token_id=settings["eos_token_id"],
                      decoder_start_token_id=settings["decoder_start_token_id"], model_type=1,
                      no_repeat_ngram_size=settings["no_repeat_ngram_size"], early_stopping=1,
                      encoder=encoder, decoder=decoder)
    return onnx.helper.make_node("BeamSearch", inputs, ["sequences"], name="BeamSearch", domain=CONTRIB_DOMAIN,
                                 **attributes)


def _search_model(settings: dict, encoder_model, decoder_model, vocab_size: int, syntax_names: tuple[str, ...] = ()):
    """The main graph: `input_ids`, `attention_mask` `(batch, source_len)`, `max_length`, `num_beams` and
    `num_return_sequences` (int32, `(1,)`), then the syntax fields `syntax_names` (int64, `(batch, source_len)`;
    `phrase_ids` `(batch, levels, source_len)`) in; `sequences` `(batch, num_return_sequences, max_length)` out."""
    from onnx import TensorProto, helper, numpy_helper

    encoder, decoder = encoder_model.graph, decoder_model.graph
    encoder.name, decoder.name = "encoder and first step", "decoder step"
    if settings["forced_eos_token_id"] is not None:
        _force_eos_at_last_step(encoder, settings["forced_eos_token_id"], vocab_size, first_step=True)
        _force_eos_at_last_step(decoder, settings["forced_eos_token_id"], vocab_size, first_step=False)
    initializers = _share_initializers([encoder, decoder], {})
    constants = {"min_length": np.array([settings["min_length"]], dtype=np.int32),
                 "length_penalty": np.array([settings["length_penalty"]], dtype=np.float32),
                 "repetition_penalty": np.array([1.0], dtype=np.float32)}
    if settings["masked_tokens"]:
        mask = np.ones(vocab_size, dtype=np.int32)
        mask[settings["masked_tokens"]] = 0
        constants["vocab_mask"] = mask
    initializers += [numpy_helper.from_array(value, name) for name, value in constants.items()]

    nodes = [_search_node(settings, encoder, decoder, vocab_mask="vocab_mask" in constants)]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch_size", "source_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch_size", "source_length"]),
              *[helper.make_tensor_value_info(name, TensorProto.INT32, [1])
                for name in ("max_length", "num_beams", "num_return_sequences")],
              *[helper.make_tensor_value_info(name, TensorProto.INT64, ["batch_size", "levels", "source_length"]
                                              if name == "phrase_ids" else ["batch_size", "source_length"])
                for name in syntax_names]]
    outputs = [helper.make_tensor_value_info("sequences", TensorProto.INT32,
                                             ["batch_size", "num_return_sequences", "max_length"])]
    graph = helper.make_graph(nodes, "mgsa search", inputs, outputs, initializer=initializers)
    opsets = {entry.domain: entry.version for model in (encoder_model, decoder_model) for entry in model.opset_import}
    opsets[CONTRIB_DOMAIN] = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version)
                                                    for domain, version in opsets.items()],
                              functions=[*encoder_model.functions, *decoder_model.functions])
    model.ir_version = max(encoder_model.ir_version, decoder_model.ir_version)
    return model


def export_search_onnx(
    model_or_folder: "str | Path | nn.Module", output_dir: str | Path, *,
    processor: "ProcessorMixin | PreTrainedTokenizerBase | None" = None, opset: int | None = None,
    overwrite: bool = False, trust_remote_code: bool = False,
) -> Path:
    """
    Write `search_model.onnx`, generation as one onnxruntime call (see the module docstring), with the config,
    generation config and processor files, to `output_dir`, for [`OrtSearchModel`].

    Args:
        model_or_folder: a folder saved by `save_pretrained` (model and processor), or a model
            ([`MgsaForConditionalGeneration`], [`MgsaT5ForConditionalGeneration`]) with its `processor`.
        processor: the model's processor, or its tokenizer for a type that reads no syntax (read from the folder
            when `model_or_folder` is one).
        output_dir: the folder to write; a folder that holds files is refused unless `overwrite`.
        opset: the ONNX opset of the subgraphs (None: the exporter's default).
        overwrite: replace an earlier export in `output_dir` (its other files are kept).
        trust_remote_code: load a saved processor whose settings name code to run.

    Raises:
        ValueError: for a model type other than `mgsa` and `mgsa_t5`, for a processor that does not make the syntax
            fields the encoder reads, and for generation settings the op cannot reproduce
            ([`check_search_settings`]).
    """
    import onnx

    source = None if isinstance(model_or_folder, nn.Module) else model_or_folder
    model, processor, folder = load_model_and_processor(model_or_folder, processor, trust_remote_code)
    if processor is None:
        raise ValueError("export_search_onnx needs the model's processor: pass `processor=` with a model object.")
    config = model.config
    if config.model_type not in ("mgsa", "mgsa_t5"):
        raise ValueError(f"The one-call ONNX search takes the Marian and T5 backbones, not {config.model_type!r}: "
                         "an mgsa-hf model (model_type `mgsa` or `mgsa_t5`) is what it exports.")
    syntax = onnx_syntax_fields(config)
    check_onnx_exportable(config)
    settings = check_search_settings(model.generation_config or GenerationConfig.from_model_config(config),
                                     "model.generation_config")
    if syntax:
        batch = processor(EXAMPLES, return_tensors="pt")
        missing = [name for name in syntax if batch.get(name) is None]
        if missing:
            raise ValueError(f'encoder_type="{config.encoder_type}" reads {missing}, which the processor does not '
                             "make: pass the model's `MgsaProcessor` (with its parser).")
    else:
        batch = getattr(processor, "tokenizer", processor)(EXAMPLES, return_tensors="pt", padding=True)
    with export_folder(output_dir, source, overwrite, SEARCH_FOLDER_FILES) as staging:
        was_training = model.training
        model.eval()
        try:
            encoder_model, decoder_model = _export_subgraphs(model, batch, syntax, staging, opset)
        finally:
            model.train(was_training)
        (staging / "encoder.onnx").unlink()
        (staging / "decoder.onnx").unlink()
        search = _search_model(settings, encoder_model, decoder_model, config.vocab_size, syntax)
        onnx.save(search, staging / SEARCH_GRAPH)
        config.save_pretrained(staging)
        processor.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        config_dict = json.loads((staging / "config.json").read_text())
        config_dict.pop("auto_map", None)
        (staging / "config.json").write_text(json.dumps(config_dict, indent=2))
        (staging / SEARCH_MANIFEST).write_text(json.dumps({"graph": SEARCH_GRAPH, "settings": settings,
                                                             "syntax_fields": list(syntax)}, indent=2))
        # last: the digests of the graph, config.json and the tokenizer files, which loading checks
        write_onnx_record(staging, {"model_type": config.model_type, "encoder_type": config.encoder_type,
                                    "backbone": type(model).__name__, "weights_sha256": weights_digest(model)})
    return Path(output_dir)


class OrtSearchModel:
    """
    A folder written by [`export_search_onnx`] in one onnxruntime session: `generate` runs the whole search (beam or
    greedy) in one call and returns `generate`'s token ids.

    Load with [`from_pretrained`].
    """

    def __init__(self, folder: Path, session, config, settings: dict, syntax_fields: tuple[str, ...] = ()):
        self.folder = folder
        self.session = session
        self.config = config
        self.settings = settings
        self.syntax_fields = tuple(syntax_fields)  # the processor fields the encoder reads

    @classmethod
    def from_pretrained(cls, folder: str | Path, *, threads: int | None = None,
                        session_options: "onnxruntime.SessionOptions | None" = None) -> "OrtSearchModel":
        """Load `folder` (an [`export_search_onnx`] folder) on onnxruntime's CPU provider with `threads` intra-op
        threads (None: every core), its graph checked against the export's record first
        ([`~mgsa_hf.export.onnx_record.verify_onnx_record`]); `session_options`, `onnxruntime.SessionOptions` used
        as given (None: [`~mgsa_hf.export.onnx_generation.cpu_session_options`]'s; `threads` must then be None)."""
        import onnxruntime

        check_search_onnxruntime(onnxruntime.__version__)
        folder = Path(folder)
        manifest_path = folder / SEARCH_MANIFEST
        if not manifest_path.is_file():
            raise ValueError(f"{folder} has no {SEARCH_MANIFEST}: it is not a folder written by `export_search_onnx`.")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            settings = manifest["settings"]
            syntax_fields = tuple(manifest.get("syntax_fields", ()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{manifest_path} is damaged ({error!r}): export the model again.") from None
        verify_onnx_record(folder, {"search": manifest["graph"]})
        session = onnxruntime.InferenceSession(str(folder / manifest["graph"]),
                                               cpu_session_options(threads, session_options),
                                               providers=["CPUExecutionProvider"])
        return cls(folder, session, AutoConfig.from_pretrained(folder), settings, syntax_fields)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 num_beams: int | None = None, max_length: int | None = None, max_new_tokens: int | None = None,
                 num_return_sequences: int | None = None, **kwargs: torch.Tensor) -> torch.LongTensor:
        """
        Translate a batch in one onnxruntime call.

        Args:
            input_ids: (batch_size, source_len) source tokens (the processor's).
            attention_mask: (batch_size, source_len) their padding mask (None: the tokens that are not padding).
            num_beams: beams (None: the exported generation config's); 1 is greedy search.
            max_length: the longest output, decoder start token included (None: the generation config's).
            max_new_tokens: the most tokens after the decoder start token (takes the place of `max_length`).
            num_return_sequences: hypotheses returned per sentence, at most `num_beams` (None: the config's).
            kwargs: the processor's other outputs: the syntax fields the encoder reads (`syntax_fields`;
                `(batch_size, source_len)`, `phrase_ids` `(batch_size, levels, source_len)`) are passed on, the others
                (`phrase_tags`, `token_type_ids`, ...) ignored; other `generate` arguments are refused by name.

        Returns:
            (batch_size * num_return_sequences, length) the token ids, decoder start token first, EOS then padding
            after each hypothesis, cut to the longest, as `generate` returns them.
        """
        unknown = sorted(name for name in kwargs if name not in PROCESSOR_FIELDS)
        if unknown:
            raise ValueError(f"OrtSearchModel.generate takes no {unknown}: the search settings are fixed at export "
                             "except num_beams, max_length / max_new_tokens and num_return_sequences.")
        settings = self.settings
        num_beams = settings["num_beams"] if num_beams is None else num_beams
        returns = settings["num_return_sequences"] if num_return_sequences is None else num_return_sequences
        if max_new_tokens is not None:
            max_length = max_new_tokens + 1
        max_length = settings["max_length"] if max_length is None else max_length
        if num_beams > 1 and not settings["beam_search"]:
            raise ValueError(f"num_beams={num_beams}: the exported generation config has early_stopping="
                             f"{settings['early_stopping']!r} and forced_eos_token_id="
                             f"{settings['forced_eos_token_id']!r}; {BEAM_SEARCH_LIMITS}. Export with those set "
                             "for beam search; greedy search (num_beams=1) reproduces `generate` with any.")
        if num_beams < 1 or returns < 1 or returns > num_beams or max_length < 2:
            raise ValueError(f"num_beams={num_beams}, num_return_sequences={returns}, max_length={max_length}: "
                             "need 1 <= num_return_sequences <= num_beams and max_length >= 2.")
        check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        positions = getattr(self.config, "max_position_embeddings", None)
        if positions is not None:  # a clear error, not an index error inside a subgraph
            check_length(input_ids, 0, positions, "source")
            check_length(torch.empty(1, max_length), 0, positions, "target")
        if attention_mask is None:
            attention_mask = input_ids.ne(settings["pad_token_id"])
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                             f"{tuple(input_ids.shape)}: pass the processor's mask of these tokens.")
        feeds = {name: self._syntax_field(kwargs, name, input_ids.shape) for name in self.syntax_fields}
        feeds |= {"input_ids": input_ids.cpu().numpy().astype(np.int32),
                 "attention_mask": attention_mask.cpu().numpy().astype(np.int32),
                 "max_length": np.array([max_length], np.int32), "num_beams": np.array([num_beams], np.int32),
                 "num_return_sequences": np.array([returns], np.int32)}
        (sequences,) = self.session.run(["sequences"], feeds)
        sequences = torch.from_numpy(sequences.astype(np.int64)).flatten(0, 1)
        return self._as_generate_returns(sequences)

    def _syntax_field(self, fields: dict, name: str, shape: torch.Size) -> np.ndarray:
        """The syntax field `name` of a processor batch `fields` as the graph takes it (int64), or a `ValueError`
        naming it when it is missing or does not match the tokens' `(batch_size, source_len)`."""
        if fields.get(name) is None:
            raise ValueError(f'encoder_type="{self.config.encoder_type}" reads {name!r}, which the inputs lack: pass '
                             "the output of the model's `MgsaProcessor` (`generate(**processor(texts, "
                             "return_tensors='pt'))`).")
        value = torch.as_tensor(fields[name])
        kept = (value.shape[0], value.shape[-1]) if name == "phrase_ids" and value.dim() == 3 else tuple(value.shape)
        if kept != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(value.shape)}, input_ids {tuple(shape)}: pass the processor's "
                             "fields of these tokens.")
        return value.cpu().numpy().astype(np.int64)

    def _as_generate_returns(self, sequences: torch.LongTensor) -> torch.LongTensor:
        """The op fills a finished hypothesis's row with EOS after its tokens (the node's `pad_token_id`: EOS, the one
        token a hypothesis never holds before its end); `generate` gives EOS then padding, cut after the longest
        hypothesis."""
        eos, pad = self.settings["eos_token_id"], self.settings["pad_token_id"]
        generated = sequences[:, 1:]
        seen = generated.eq(eos).long().cumsum(1)
        after_eos = (seen - generated.eq(eos).long()) > 0  # positions after the first EOS
        generated = generated.masked_fill(after_eos, pad)
        lengths = 1 + (seen == 0).sum(1) + (seen[:, -1] > 0).long()  # start, tokens, the EOS if any
        return torch.cat([sequences[:, :1], generated], dim=1)[:, : int(lengths.max())]

    def translate(self, processor, texts: list[str], **settings) -> list[str]:
        """Translate `texts` with the model's processor (a tokenizer will do for an encoder that reads no syntax):
        the best hypothesis of each, decoded without special tokens. `settings` go to [`generate`] (`num_beams`,
        `max_new_tokens`, ...)."""
        tokenizer = getattr(processor, "tokenizer", processor)
        if self.syntax_fields:
            if tokenizer is processor:
                raise ValueError(f'encoder_type="{self.config.encoder_type}" reads {list(self.syntax_fields)}: '
                                 "translate needs the model's `MgsaProcessor`, not its tokenizer.")
            batch = processor(list(texts), return_tensors="pt", syntax_fields=self.syntax_fields)
        else:
            batch = tokenizer(list(texts), return_tensors="pt", padding=True)
        fields = {name: batch[name] for name in self.syntax_fields if name in batch}
        sequences = self.generate(batch["input_ids"], batch["attention_mask"], **fields, **settings)
        best = sequences[:: len(sequences) // len(texts)]
        return tokenizer.batch_decode(best, skip_special_tokens=True)
