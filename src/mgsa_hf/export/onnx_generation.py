"""ONNX Runtime generation with a KV cache, for every encoder type on both backbones.

[`export_generation_onnx`] writes a saved MGSA model (or a model object) to a self-contained folder in the layout
optimum uses for seq2seq models:

- `encoder_model.onnx`: `input_ids`, `attention_mask` `(batch, source_length)` and the source syntax fields the
  encoder type reads ([`~mgsa_hf.export.onnx_syntax_fields`]) → `last_hidden_state` `(batch, source_length, d_model)`
  and, for PR, `phrase_states` `(batch, encoder_layers + 1, num_phrases, d_model)` and `phrase_mask`
  `(batch, num_phrases)`: everything the decoder reads from the source.
- `decoder_model.onnx`, the first decoding step: `decoder_input_ids` `(batch, target_length)`,
  `encoder_attention_mask`, the encoder's outputs → `logits` `(batch, vocab_size)` of the last position,
  `present.{i}.decoder.{key,value}` (the self-attention cache, `(batch, heads, target_length, head_dim)`) and
  `present.{j}.encoder.{key,value}` (the cross-attention keys and values, PR's phrase keys and values after them).
- `decoder_with_past_model.onnx`, every later step: one token per row, the mask, the caches as
  `past_key_values.{i}.decoder.*` / `past_key_values.{j}.encoder.*` → `logits` and the self-attention cache grown by
  one position.

Batch, source, target, cache and phrase lengths are dynamic. The folder also holds `config.json`,
`generation_config.json`, the tokenizer / processor files, `onnx_generation.json`, which names the graphs' inputs
and outputs, and `onnx_record.json`, written last, the SHA-256 of each graph and of `config.json`
([`~mgsa_hf.export.onnx_record`]), which loading checks them against. `quantize=True` quantizes the graphs'
weights to int8 (onnxruntime's dynamic quantization; [`quantize_generation_onnx`] does it to an exported folder).

[`OrtMgsaForConditionalGeneration`] loads such a folder into onnxruntime sessions behind transformers'
`GenerationMixin`: `generate` (greedy, beam search, sampling, `num_return_sequences`, the saved generation config) and
the package's translation pipeline run on it as on the PyTorch model.

This module is a tool: the model's own modules never import it. It needs the `export` extra (onnx, onnxscript,
onnxruntime).
"""

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.processing_utils import ProcessorMixin
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ..generation_arguments import check_generation_arguments, check_generation_length
from ..input_checks import check_token_ids
from ..modeling_common import OUTPUT_CACHE_FIELD, MgsaEncoderOutput, check_length
from ..weights_checksums import check_generation_config
from . import check_onnx_exportable, onnx_syntax_fields
from .onnx_record import read_onnx_record, verify_onnx_record, weights_digest, write_onnx_record


if TYPE_CHECKING:
    import onnxruntime

MANIFEST = "onnx_generation.json"
GRAPHS = {"encoder": "encoder_model.onnx", "decoder": "decoder_model.onnx",
          "decoder_with_past": "decoder_with_past_model.onnx"}
# the model folder's files that the ONNX folder keeps (every file but the weights and the model code)
SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".data", ".sha256")
# sentences to trace with: three sentences of different lengths, so that no dynamic axis has size 1 or equals another
EXAMPLES = [
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two dogs play in the snow.",
    "A little girl climbs into a wooden playhouse while her brother watches.",
]


def cache_names(kind: str, side: str, count: int) -> list[str]:
    """`{kind}.{i}.{side}.key` / `.value` for `count` layers, optimum's names (`kind`: `present` or
    `past_key_values`; `side`: `decoder` for the self-attention, `encoder` for the cross-attention)."""
    return [f"{kind}.{i}.{side}.{part}" for i in range(count) for part in ("key", "value")]


def flat_cache(cache) -> list[torch.Tensor]:
    """The keys and values of a `DynamicCache`'s layers, in the order of [`cache_names`]."""
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


def filled_cache(tensors: tuple[torch.Tensor, ...]) -> DynamicCache:
    """A `DynamicCache` holding `tensors` (key, value, key, value, ...), one layer per pair."""
    cache = DynamicCache()
    for layer_idx in range(len(tensors) // 2):
        cache.update(tensors[2 * layer_idx], tensors[2 * layer_idx + 1], layer_idx)
    return cache


class EncoderGraph(nn.Module):
    """What `encoder_model.onnx` computes: the source tokens, their mask and syntax fields `(batch, source_length)`
    (`phrase_ids`: `(batch, levels, source_length)`) → the source states `(batch, source_length, d_model)` and PR's
    phrase states `(batch, encoder_layers + 1, num_phrases, d_model)` and mask `(batch, num_phrases)`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, word_ids=None, head_word_ids=None, phrase_ids=None,
                pr_phrase_ids=None, local_phrase_start=None, local_phrase_end=None, tree_depth=None):
        """The encoder on a processor batch's source fields (None: a field the encoder type does not read); returns
        `(last_hidden_state,)`, or for PR `(last_hidden_state, phrase_states, phrase_mask)`."""
        outputs = self.model.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask, word_ids=word_ids, head_word_ids=head_word_ids,
            phrase_ids=phrase_ids, pr_phrase_ids=pr_phrase_ids, local_phrase_start=local_phrase_start,
            local_phrase_end=local_phrase_end, tree_depth=tree_depth,
        )
        if outputs.phrase_states is None:
            return (outputs.last_hidden_state,)
        return outputs.last_hidden_state, outputs.phrase_states, outputs.phrase_mask


class DecoderGraph(nn.Module):
    """
    What the decoder graphs compute: one decoding step of `model`'s decoder and language-model head.

    Without past (`decoder_model.onnx`), `decoder_input_ids` `(batch, target_length)` attend to each other and to the
    source; the outputs are the last position's logits `(batch, vocab_size)`, the self-attention cache and the
    cross-attention keys and values (PR's phrase ones after the token ones). With past
    (`decoder_with_past_model.onnx`), `decoder_input_ids` `(batch, 1)` follow the cached positions; the outputs are
    the logits and the self-attention cache one position longer.
    """

    def __init__(self, model: nn.Module, memory_names: list[str], num_self: int, num_cross: int, with_past: bool):
        super().__init__()
        self.model = model
        self.memory_names = memory_names
        self.num_self, self.num_cross, self.with_past = num_self, num_cross, with_past

    def forward(self, decoder_input_ids, encoder_attention_mask, *tensors):
        """One decoding step: `tensors` are the source memories (`memory_names`: the encoder states, PR's phrase
        states and mask) and, with past, the self-attention then cross-attention keys and values of every layer;
        returns the last position's logits `(batch, vocab_size)` and the caches to feed back."""
        memories = dict(zip(self.memory_names, tensors[: len(self.memory_names)], strict=True))
        past = tensors[len(self.memory_names):]
        if self.with_past:
            self_cache = filled_cache(past[: 2 * self.num_self])
            cross_cache = filled_cache(past[2 * self.num_self:])  # marked as computed by `EncoderDecoderCache`
        else:
            self_cache, cross_cache = DynamicCache(), DynamicCache()
        cache = EncoderDecoderCache(self_cache, cross_cache)
        outputs = self.model.get_decoder()(
            input_ids=decoder_input_ids,
            encoder_hidden_states=memories.pop("encoder_hidden_states"),
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=cache,
            use_cache=True,
            **memories,
        )
        logits = self.model.language_model_logits(outputs.last_hidden_state[:, -1])
        if self.with_past:
            return logits, *flat_cache(cache.self_attention_cache)
        return logits, *flat_cache(cache.self_attention_cache), *flat_cache(cache.cross_attention_cache)


def trace_to_onnx(module, args, dynamic_shapes, input_names, output_names, path, opset):
    """Trace a graph module (`forward(first, second, *tensors)`: [`EncoderGraph`], [`DecoderGraph`] and the one-call
    search's subgraphs) on `args` with `torch.export` and write it to `path` (one file, no external data)."""
    # the exporter's progress messages (some onnxscript releases print them) go to stderr, not the caller's stdout
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
        program = torch.onnx.export(
            # `forward(decoder_input_ids, encoder_attention_mask, *tensors)`: the varargs' shapes come as one tuple
            module.eval(), tuple(args), dynamic_shapes=(*dynamic_shapes[:2], tuple(dynamic_shapes[2:])),
            input_names=input_names, output_names=output_names, opset_version=opset, optimize=True, dynamo=True,
            verbose=False,
        )
    program.save(path, external_data=False)


def load_model_and_processor(model_or_folder, processor, trust_remote_code: bool = False):
    """`(model, processor, folder)` of a model object (`folder` None) or a saved folder (its model, and its processor
    unless `processor` is given; a processor that names code only with `trust_remote_code`)."""
    from transformers import AutoModelForSeq2SeqLM

    import mgsa_hf  # noqa: F401  (registers the model types)

    if isinstance(model_or_folder, nn.Module):
        return model_or_folder, processor, None
    folder = Path(model_or_folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    if processor is None:
        from transformers import AutoTokenizer

        from ..processing_mgsa import MgsaProcessor

        try:
            processor = MgsaProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError):
            if onnx_syntax_fields(model.config):
                raise
            processor = AutoTokenizer.from_pretrained(folder)  # a model that reads no syntax, saved with its tokenizer
    return model, processor, folder


def export_generation_onnx(
    model_or_folder: "str | Path | PreTrainedModel", output_dir: str | Path, *, quantize: bool = False,
    opset: int | None = None, processor: ProcessorMixin | PreTrainedTokenizerBase | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """
    Write the encoder and the two decoder graphs of an MGSA translation model (any encoder type, Marian or T5
    backbone) to `output_dir`, with its config, generation config and processor files, for
    [`OrtMgsaForConditionalGeneration`] (see the module docstring for the graphs' inputs and outputs).

    Args:
        model_or_folder: a folder saved by `save_pretrained` (model and processor), or a model
            ([`MgsaForConditionalGeneration`], [`MgsaT5ForConditionalGeneration`]) with its `processor`.
        output_dir: the folder to write (made if missing; its graphs are overwritten).
        quantize: quantize the graphs' weights to int8 (`onnxruntime.quantization.quantize_dynamic`).
        opset: the ONNX opset (None: the exporter's default).
        processor: the model's [`MgsaProcessor`] (or tokenizer, for a model that reads no syntax); read from the
            folder when `model_or_folder` is one.
        trust_remote_code: load a saved processor whose settings name code to run (a `tree_parser` import path,
            `parser_code`); without it such a processor is refused.

    Returns:
        `output_dir`.
    """
    if not isinstance(model_or_folder, nn.Module):  # the graphs never go into the folder they are made from
        from ..training.ownership import check_output_folder

        check_output_folder(output_dir, source=model_or_folder, overwrite=True)
    model, processor, folder = load_model_and_processor(model_or_folder, processor, trust_remote_code)
    if processor is None:
        raise ValueError("export_generation_onnx needs the model's processor: pass `processor=` with a model object.")
    config = model.config
    check_onnx_exportable(config)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    syntax_names = list(onnx_syntax_fields(config))
    batch = processor(EXAMPLES, return_tensors="pt")
    missing = [name for name in syntax_names if batch.get(name) is None]
    if missing:
        raise ValueError(f'encoder_type="{config.encoder_type}" reads {missing}, which the processor does not make: '
                         "pass the model's `MgsaProcessor` (with its parser).")
    encoder_inputs = {name: torch.as_tensor(batch[name]).long() for name in ["input_ids", "attention_mask",
                                                                               *syntax_names]}
    was_training = model.training
    model.eval()
    try:
        manifest = _export_graphs(model, encoder_inputs, syntax_names, output_dir, opset)
    finally:
        model.train(was_training)
    manifest["quantized"] = None
    manifest["backbone"] = type(model).__name__

    if folder is not None:
        for path in folder.iterdir():
            if path.is_file() and not path.name.endswith(SKIPPED_SUFFIXES) and not path.name.endswith(".py"):
                shutil.copy2(path, output_dir / path.name)
    else:
        config.save_pretrained(output_dir)
        processor.save_pretrained(output_dir)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(output_dir)
    config_dict = json.loads((output_dir / "config.json").read_text())
    config_dict.pop("auto_map", None)  # no remote code beside the graphs
    (output_dir / "config.json").write_text(json.dumps(config_dict, indent=2))
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    # last: the record of the graphs and config written, which loading checks them against
    write_onnx_record(output_dir, {"model_type": config.model_type, "encoder_type": config.encoder_type,
                                   "backbone": manifest["backbone"], "weights_sha256": weights_digest(model)})
    if quantize:
        quantize_generation_onnx(output_dir)
    return output_dir


def quantize_generation_onnx(folder: str | Path, output_dir: str | Path | None = None) -> Path:
    """Quantize the graphs of an [`export_generation_onnx`] folder to int8 weights with onnxruntime's dynamic
    quantization (int8 matrix products, activations quantized on the fly), in place or into a copy `output_dir`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = Path(folder)
    output_dir = Path(output_dir) if output_dir is not None else folder
    manifest = json.loads((folder / MANIFEST).read_text())
    verify_onnx_record(folder, manifest["graphs"])
    record = read_onnx_record(folder)
    if output_dir != folder:
        shutil.copytree(folder, output_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.onnx"))
    if manifest.get("quantized"):
        raise ValueError(f"{folder} is already quantized ({manifest['quantized']}).")
    for name in manifest["graphs"].values():
        # without the exporter's recorded shapes: the quantizer of onnxruntime < 1.21 re-infers them and refuses the
        # tied output projection's ("Inferred shape and existing shape differ")
        graph = onnx.load(folder / name)
        graph.graph.ClearField("value_info")
        unshaped, quantized = (output_dir / f"{Path(name).stem}.{kind}.onnx" for kind in ("unshaped", "int8"))
        onnx.save(graph, unshaped)
        try:
            quantize_dynamic(unshaped, quantized, weight_type=QuantType.QInt8)
        finally:
            unshaped.unlink()
        quantized.replace(output_dir / name)
    manifest["quantized"] = "int8"
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if record is not None:  # a folder exported without a record stays without one
        write_onnx_record(output_dir, {key: value for key, value in record["model"].items() if key != "config_sha256"},
                          quantized="int8")
    return output_dir


def _export_graphs(model, encoder_inputs: dict, syntax_names: list[str], output_dir: Path, opset) -> dict:
    """Trace and write the three graphs; return the manifest of their inputs and outputs."""
    batch = torch.export.Dim("batch")
    source = torch.export.Dim("source_length")
    encoder = EncoderGraph(model)
    with torch.no_grad():
        encoder_outputs = encoder(**encoder_inputs)
    memory_names = ["encoder_hidden_states"]
    encoder_output_names = ["last_hidden_state"]
    if len(encoder_outputs) == 3:
        memory_names += ["encoder_phrase_states", "encoder_phrase_mask"]
        encoder_output_names += ["phrase_states", "phrase_mask"]
    encoder_shapes = {name: {0: batch, 1: source} for name in encoder_inputs}
    if "phrase_ids" in encoder_shapes:
        encoder_shapes["phrase_ids"] = {0: batch, 2: source}
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
        program = torch.onnx.export(
            encoder.eval(), (), kwargs=encoder_inputs, dynamic_shapes=encoder_shapes,
            output_names=encoder_output_names, opset_version=opset, optimize=True, dynamo=True, verbose=False,
        )
    program.save(output_dir / GRAPHS["encoder"], external_data=False)

    # the first decoding step, traced on two target tokens so that the target length stays dynamic
    num_self = model.config.decoder_layers if hasattr(model.config, "decoder_layers") else model.config.num_layers
    mask = encoder_inputs["attention_mask"]
    start = torch.full((mask.shape[0], 2), model.config.decoder_start_token_id, dtype=torch.long)
    start[:, 1] = 5
    probe = DecoderGraph(model, memory_names, num_self, 0, with_past=False)
    with torch.no_grad():
        first = probe(start, mask, *encoder_outputs)
    num_cross = (len(first) - 1 - 2 * num_self) // 2
    self_names = cache_names("present", "decoder", num_self)
    cross_names = cache_names("present", "encoder", num_cross)
    phrases = torch.export.Dim("num_phrases")
    memory_shapes = [{0: batch, 1: source}]
    if len(memory_names) == 3:
        memory_shapes += [{0: batch, 2: phrases}, {0: batch, 1: phrases}]
    # PR's phrase keys and values (the cross cache's layers past the decoder's) run over phrases, not tokens
    cross_shapes = [{0: batch, 2: source if j < num_self else phrases} for j in range(num_cross) for _ in range(2)]
    target = torch.export.Dim("target_length")
    decoder_inputs = ["decoder_input_ids", "encoder_attention_mask", *memory_names]
    trace_to_onnx(
        probe, (start, mask, *encoder_outputs), [{0: batch, 1: target}, {0: batch, 1: source}, *memory_shapes],
        decoder_inputs, ["logits", *self_names, *cross_names], output_dir / GRAPHS["decoder"], opset,
    )

    past_length = torch.export.Dim("past_length")
    self_past = first[1: 1 + 2 * num_self]
    cross_past = first[1 + 2 * num_self:]
    with_past = DecoderGraph(model, memory_names, num_self, num_cross, with_past=True)
    past_self_names = cache_names("past_key_values", "decoder", num_self)
    past_cross_names = cache_names("past_key_values", "encoder", num_cross)
    trace_to_onnx(
        with_past, (start[:, :1], mask, *encoder_outputs, *self_past, *cross_past),
        [{0: batch}, {0: batch, 1: source}, *memory_shapes, *[{0: batch, 2: past_length}] * len(self_past),
         *cross_shapes],
        [*decoder_inputs, *past_self_names, *past_cross_names], ["logits", *self_names],
        output_dir / GRAPHS["decoder_with_past"], opset,
    )
    return {
        "graphs": GRAPHS, "syntax_fields": syntax_names, "encoder_outputs": encoder_output_names,
        "decoder_memories": memory_names, "num_self_attention_layers": num_self,
        "num_cross_attention_layers": num_cross,
    }


def cpu_session_options(threads: int | None = None, session_options: "onnxruntime.SessionOptions | None" = None,
                        *, spinning: bool = False) -> "onnxruntime.SessionOptions":
    """
    The `onnxruntime.SessionOptions` the ONNX models run with: `session_options` as given, else every graph
    optimization, one inter-op thread and `threads` intra-op threads (None: every core) that do not spin between two
    runs (unless `spinning`).

    Between two session runs the search does its own work on the same cores (in Python for `generate`, inside
    onnxruntime for the one-call search): pool threads spinning for the next run would take them. With 2 threads on
    2 cores, spinning made `generate`'s beam search 1.7x slower on a busy machine; on a quiet one (one run each) it
    gave step-by-step generation 1% and the one-call search 8%, at 13% and 3% more CPU time (benchmarks/BENCHMARKS.md,
    "Serving with ONNX Runtime").

    Raises:
        ValueError: for both `threads` and `session_options` (set `intra_op_num_threads` on the options instead).
    """
    import onnxruntime

    if session_options is not None:
        if threads is not None:
            raise ValueError(f"threads={threads!r} with session_options: set session_options.intra_op_num_threads "
                             "instead (session_options are used as given).")
        return session_options
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", str(int(spinning)))
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


class OrtSeq2SeqCache:
    """
    The decoder caches of [`OrtMgsaForConditionalGeneration`] as the graphs take them: numpy arrays named as the
    `decoder_with_past_model.onnx` inputs. `self_attention` grows by a position each step; `cross_attention` (the
    source keys and values, PR's phrase ones included) stays as the first step made it.
    """

    def __init__(self, self_attention: dict[str, np.ndarray], cross_attention: dict[str, np.ndarray]):
        self.self_attention = self_attention
        self.cross_attention = cross_attention

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The number of cached target positions."""
        return next(iter(self.self_attention.values())).shape[2]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: keep the rows of the beams `beam_idx` `(batch * num_beams,)` picks. The cross-attention
        keys and values are left as they are: the beams of a sentence share them, and `beam_idx` picks among the
        beams of the same sentence."""
        index = beam_idx.cpu().numpy()
        self.self_attention = {name: array[index] for name, array in self.self_attention.items()}


class OrtEncoder(nn.Module):
    """The `encoder_model.onnx` session as `generate` calls an encoder: the source tokens, mask and syntax fields in,
    an [`MgsaEncoderOutput`] (PR: with `phrase_states`, `phrase_mask`) out."""

    main_input_name = "input_ids"

    def __init__(self, session, output_names: list[str], vocab_size: int, positions: int | None = None):
        super().__init__()
        self.session = session
        self.vocab_size = vocab_size
        self.positions = positions  # `max_position_embeddings` (None: T5's relative positions)
        self.input_names = [graph_input.name for graph_input in session.get_inputs()]
        self.output_names = output_names

    def forward(self, input_ids=None, attention_mask=None, word_ids=None, head_word_ids=None, phrase_ids=None,
                phrase_tags=None, pr_phrase_ids=None, local_phrase_start=None, local_phrase_end=None,
                tree_depth=None, **kwargs) -> MgsaEncoderOutput:
        """The processor's fields by name, as the PyTorch encoder takes them; those the graph does not read (and
        `generate`'s other keyword arguments) are ignored."""
        if attention_mask is None:
            raise ValueError("The ONNX encoder needs the source `attention_mask` (pass the processor's output).")
        fields = {name: value for name, value in locals().items() if name not in ("self", "kwargs")}
        check_token_ids(input_ids, self.vocab_size, "input_ids")
        if self.positions is not None:
            check_length(torch.as_tensor(input_ids), 0, self.positions, "source")
        missing = [name for name in self.input_names if fields.get(name) is None]
        if missing:
            raise ValueError(f"The ONNX encoder reads {missing}, which the inputs lack: pass the output of the "
                             "model's `MgsaProcessor` (`generate(**processor(texts, return_tensors='pt'))`).")
        feeds = {name: torch.as_tensor(fields[name]).long().cpu().numpy() for name in self.input_names}
        outputs = dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))
        return MgsaEncoderOutput(**{name: torch.from_numpy(value) for name, value in outputs.items()})


class OrtMgsaForConditionalGeneration(PreTrainedModel, GenerationMixin):
    """
    An MGSA translation model exported by [`export_generation_onnx`], run by onnxruntime behind transformers'
    `GenerationMixin`: `generate(**processor(texts, return_tensors="pt"))` decodes (greedy, beam search, sampling,
    `num_return_sequences`, following `generation_config`) with the graphs' cache, and
    `pipeline("translation", model=ort_model, tokenizer=processor)` serves it. It holds no weights; tensors are CPU
    torch tensors on the outside, numpy arrays for the sessions.

    Load with [`from_pretrained`].
    """

    config_class = PretrainedConfig
    main_input_name = "input_ids"
    base_model_prefix = "model"
    _supports_cache_class = True
    _is_stateful = False
    _supports_static_cache = False

    def __init__(self, folder: Path, config: PretrainedConfig, sessions: dict, manifest: dict,
                 generation_config: GenerationConfig | None = None, torch_threads: int | None = 1):
        super().__init__(config)
        self.torch_threads = torch_threads
        self.name_or_path = str(folder)
        self.manifest = manifest
        self.generation_config = generation_config or GenerationConfig.from_model_config(config)
        self.sessions = sessions
        self.positions = getattr(config, "max_position_embeddings", None)
        self.encoder = OrtEncoder(sessions["encoder"], manifest["encoder_outputs"], config.vocab_size, self.positions)
        self.decoder_inputs = {kind: [graph_input.name for graph_input in sessions[kind].get_inputs()]
                               for kind in ("decoder", "decoder_with_past")}
        num_self, num_cross = manifest["num_self_attention_layers"], manifest["num_cross_attention_layers"]
        self.present_self = cache_names("present", "decoder", num_self)
        self.present_cross = cache_names("present", "encoder", num_cross)
        self.past_self = cache_names("past_key_values", "decoder", num_self)
        self.past_cross = cache_names("past_key_values", "encoder", num_cross)

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, *, threads: int | None = None, provider: str = "CPUExecutionProvider",
        torch_threads: int | None = 1, session_options: "onnxruntime.SessionOptions | None" = None,
    ) -> "OrtMgsaForConditionalGeneration":
        """
        Load a folder written by [`export_generation_onnx`], its graphs checked against the export's record first.

        Args:
            folder: the ONNX folder.
            threads: onnxruntime's intra-op threads (None: onnxruntime's default, every core).
            provider: the onnxruntime execution provider.
            session_options: `onnxruntime.SessionOptions` for every graph, used as given (None: those of
                [`cpu_session_options`]); `threads` must then be None.
            torch_threads: torch's intra-op threads while `generate` runs (its search work between two session
                runs), restored after it; None leaves torch's setting. With torch on every core too, its pool
                competed with onnxruntime's for the same cores: on a busy 2-core machine, beam search on 2 threads
                then ran 2.5-6x slower than on 1.

        Raises:
            ValueError: naming the file, for a graph or `config.json` that is not the one exported with the others
                ([`~mgsa_hf.export.onnx_record.verify_onnx_record`]) and for a damaged `generation_config.json`.
        """
        import onnxruntime

        import mgsa_hf  # noqa: F401  (registers the config types)

        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise ValueError(f"{folder} has no {MANIFEST}: it is not a folder written by `export_generation_onnx` "
                             "(`mgsa-hf export onnx FOLDER OUT`).")
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{folder / MANIFEST} is damaged: not valid JSON ({error}). Export the model again "
                             "(`mgsa-hf export onnx FOLDER OUT --overwrite`).") from None
        # before any session: every graph is the one exported with the others and with config.json
        verify_onnx_record(folder, manifest["graphs"])
        check_generation_config(folder)  # a damaged one would decode with defaults, as in the PyTorch path
        options = cpu_session_options(threads, session_options)
        sessions = {kind: onnxruntime.InferenceSession(str(folder / name), options, providers=[provider])
                    for kind, name in manifest["graphs"].items()}
        config = AutoConfig.from_pretrained(folder)
        try:
            generation_config = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation_config = None
        return cls(folder, config, sessions, manifest, generation_config, torch_threads)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @classmethod
    def can_generate(cls) -> bool:
        return True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is made by the first step ([`OrtSeq2SeqCache`])

    def get_encoder(self) -> OrtEncoder:
        return self.encoder

    def get_input_embeddings(self) -> None:
        """None: the embeddings are inside the graphs (the token ids are checked against `config.vocab_size`)."""
        return None

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """`GenerationMixin.generate`, after the checks of the PyTorch models' `generate`: counting parameters of at
        least 1 and a translation length within the decoder's positions ([`check_generation_length`]); torch runs
        on `torch_threads` threads meanwhile ([`from_pretrained`])."""
        check_generation_arguments(kwargs)
        prefix, config_arguments = "model.generation_config.", vars(self.generation_config)
        if generation_config is not None:
            prefix, config_arguments = "generation_config.", vars(generation_config)
        check_generation_arguments(config_arguments, prefix=prefix)
        check_generation_length(kwargs, config_arguments, prefix, self.positions)
        threads = torch.get_num_threads()
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        try:
            return super().generate(inputs, generation_config, **kwargs)
        finally:
            torch.set_num_threads(threads)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, encoder_outputs=None, **kwargs) -> dict:
        """The step's inputs: all decoder tokens at the first step, the last one once there is a cache."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            input_ids = input_ids[:, -1:]
        return {"decoder_input_ids": input_ids, "attention_mask": attention_mask, "encoder_outputs": encoder_outputs,
                "cache": cache}

    def _reorder_cache(self, cache: OrtSeq2SeqCache, beam_idx: torch.LongTensor) -> OrtSeq2SeqCache:
        cache.reorder_cache(beam_idx)
        return cache

    def forward(self, decoder_input_ids=None, attention_mask=None, encoder_outputs=None, cache=None,
                past_key_values=None, input_ids=None, **kwargs) -> Seq2SeqLMOutput:
        """
        One decoding step: `decoder_input_ids` `(batch, target_length)` (one token with a `cache`) against the
        source's `encoder_outputs` and padding `attention_mask` `(batch, source_length)`; the encoder runs first
        when only `input_ids` are given. Returns the last position's `logits` `(batch, 1, vocab_size)` and the
        [`OrtSeq2SeqCache`].
        """
        cache = cache if cache is not None else past_key_values
        if self.positions is not None:  # a clear error, not an index error inside the graph's position embedding
            check_length(decoder_input_ids, 0 if cache is None else cache.get_seq_length(), self.positions, "target")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        values = {
            "decoder_input_ids": decoder_input_ids,
            "encoder_attention_mask": attention_mask,
            "encoder_hidden_states": encoder_outputs.last_hidden_state,
            "encoder_phrase_states": getattr(encoder_outputs, "phrase_states", None),
            "encoder_phrase_mask": getattr(encoder_outputs, "phrase_mask", None),
        }
        feeds = {name: value.cpu().numpy() for name, value in values.items() if value is not None}
        feeds["decoder_input_ids"] = feeds["decoder_input_ids"].astype(np.int64)
        feeds["encoder_attention_mask"] = feeds["encoder_attention_mask"].astype(np.int64)
        if cache is None:
            names = self.decoder_inputs["decoder"]
            outputs = self.sessions["decoder"].run(None, {name: feeds[name] for name in names})
            logits, tensors = outputs[0], outputs[1:]
            num_self = len(self.present_self)
            cache = OrtSeq2SeqCache(dict(zip(self.past_self, tensors[:num_self], strict=True)),
                                    dict(zip(self.past_cross, tensors[num_self:], strict=True)))
        else:
            feeds.update(cache.self_attention)
            feeds.update(cache.cross_attention)
            names = self.decoder_inputs["decoder_with_past"]
            outputs = self.sessions["decoder_with_past"].run(None, {name: feeds[name] for name in names})
            logits = outputs[0]
            cache.self_attention = dict(zip(self.past_self, outputs[1:], strict=True))
        return Seq2SeqLMOutput(logits=torch.from_numpy(logits)[:, None], **{OUTPUT_CACHE_FIELD: cache})
