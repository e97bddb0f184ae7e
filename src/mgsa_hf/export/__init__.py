"""Export MGSA models for deployment.

**ONNX**, every encoder type and both backbones: [`export_onnx`] writes one graph of the teacher-forced seq2seq
forward: the source tokens, their padding mask, the source syntax fields the encoder type reads
([`onnx_syntax_fields`]) and the decoder tokens in, the logits out, with dynamic batch and sequence axes.
[`onnx_inputs`] picks a graph's inputs from a processor batch for onnxruntime.

**CTranslate2**, the plain Transformer (`encoder_type="transformer"`, Marian backbone): [`export_ctranslate2`] writes
a CTranslate2 model of a saved folder. CTranslate2's Transformer spec has plain multi-head attention only, so the
variants, whose encoders attend over phrases (MG-SA, PR), through a gated local window (hybrid) or with syntax biases
and redundant-head replacement (RHE), have no CTranslate2 form: they go to ONNX.

Both need the `export` extra (`pip install "mgsa-hf[export]"`: onnx, onnxscript, onnxruntime, ctranslate2).

An export folder is written beside its target and swapped in whole ([`export_folder`]): never into the model's own
folder, and into a folder that holds files only when told to replace them (`overwrite`, `mgsa-hf export
--overwrite`), which replaces an earlier export's files and keeps the others.
"""

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn


# the source syntax fields a graph can take, in the order of its inputs (`syntax_fields.py`); `phrase_tags` feeds only
# MG-SA's tag loss, never the logits
EXPORTABLE_SYNTAX_FIELDS = (
    "word_ids", "head_word_ids", "phrase_ids", "pr_phrase_ids", "local_phrase_start", "local_phrase_end", "tree_depth",
)


# what an export of each kind writes, and takes the place of in a folder it replaces
ONNX_FOLDER_FILES = ("*.onnx", "*.onnx.data", "*.onnx_data", "onnx_generation.json", "config.json",
                     "generation_config.json", "README.md", "weights.sha256", "onnx_record.json")
CT2_FOLDER_FILES = ("model.bin", "config.json", "*vocabulary.json", "*vocabulary.txt", "vmap.txt")


@contextlib.contextmanager
def export_folder(output_dir: str | Path, source: str | Path | None, overwrite: bool, replaces: tuple[str, ...]):
    """
    Write an export into the yielded folder, swapped in as `output_dir` when the block ends without an error.

    Args:
        output_dir: the export folder; refused when it is `source` or holds it, and when it holds files unless
            `overwrite` ([`~mgsa_hf.training.ownership.check_output_folder`]).
        source: the model folder exported (None for a model object).
        overwrite: replace what `output_dir` holds: the files matching `replaces` go, the others are kept.
        replaces: `fnmatch` patterns of an earlier export's files.
    """
    from ..atomic_saves import PROCESSOR_FILES, staged_folder
    from ..training.ownership import check_output_folder

    check_output_folder(output_dir, source=source, overwrite=overwrite)
    with staged_folder(output_dir, replaces=(*replaces, *PROCESSOR_FILES)) as staging:
        yield staging


def onnx_syntax_fields(config) -> tuple[str, ...]:
    """The source syntax fields that `config`'s encoder reads to compute the logits, as its variant says
    ([`~mgsa_hf.modeling_variant.Variant.syntax_fields`]): MG-SA's `phrase_ids` with the syntactic partition, PR's
    `pr_phrase_ids` with the parse segmentation, RHE's dependencies and local phrases (as its `rhe_attention` and
    `rhe_mode` need them); none for the plain Transformer, hybrid, n-gram MG-SA and fixed-size PR."""
    return tuple(config.variant.syntax_fields(config))


def onnx_input_names(config) -> list[str]:
    """The inputs of the graph [`export_onnx`] writes for `config`, in order (all `int64`)."""
    return ["input_ids", "attention_mask", "decoder_input_ids", *onnx_syntax_fields(config)]


def exporter_writes_scan() -> bool:
    """Whether this torch's ONNX exporter converts `torch._higher_order_ops.scan` into an ONNX `Scan` (torch 2.13
    does): MG-SA's recurrences export as scans."""
    try:
        from torch._higher_order_ops.scan import scan  # noqa: F401
        from torch.onnx._internal.exporter._torchlib.ops import hop
    except ImportError:
        return False
    return hasattr(hop, "higher_order_scan")


def check_onnx_exportable(config) -> None:
    """Raise a clear error for the settings this torch cannot export: MG-SA's recurrent composition and interactions
    (`phrase_composition="lstm"`, `phrase_interaction="lstm"` / `"on_lstm"`, the default) export as scans over the
    padded phrases, which need an exporter that writes ONNX `Scan` ([`exporter_writes_scan`])."""
    if config.encoder_type != "phrase_memory":
        return
    recurrent = {
        name: getattr(config, name)
        for name in ("phrase_composition", "phrase_interaction")
        if getattr(config, name) in ("lstm", "on_lstm")
    }
    if recurrent and not exporter_writes_scan():
        settings = ", ".join(f"{name}={value!r}" for name, value in recurrent.items())
        raise ValueError(
            f"MG-SA with {settings} exports its recurrences as ONNX `Scan` nodes, which the ONNX exporter of this "
            f"torch ({torch.__version__}) cannot write: install a torch whose exporter converts "
            "`torch._higher_order_ops.scan` (2.13 does), or export a setting without a recurrence (e.g. the row "
            'phrase_memory/syntactic_tag: the "max", "mean" or "sans" composition and phrase_interaction="none").'
        )


class Seq2SeqLogits(nn.Module):
    """
    What [`export_onnx`] traces: `model`'s teacher-forced forward without a cache, from the source tokens, their
    padding mask, the decoder tokens and the source syntax fields to the logits.

    Inputs are `(batch_size, source_len)` (`phrase_ids`: `(batch_size, levels, source_len)`) and `decoder_input_ids`
    `(batch_size, target_len)`; the output is `(batch_size, target_len, vocab_size)`.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor,
        decoder_input_ids: torch.LongTensor,
        word_ids: torch.LongTensor | None = None,
        head_word_ids: torch.LongTensor | None = None,
        phrase_ids: torch.LongTensor | None = None,
        pr_phrase_ids: torch.LongTensor | None = None,
        local_phrase_start: torch.LongTensor | None = None,
        local_phrase_end: torch.LongTensor | None = None,
        tree_depth: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """
        Args:
            input_ids, attention_mask: (batch_size, source_len) source tokens and their padding mask.
            decoder_input_ids: (batch_size, target_len) decoder tokens (teacher forcing).
            word_ids, head_word_ids, pr_phrase_ids, local_phrase_start, local_phrase_end, tree_depth:
                (batch_size, source_len) source syntax fields, those the encoder type reads (see
                [`MgsaSyntaxInputs`]); the others are None and not graph inputs.
            phrase_ids: (batch_size, levels, source_len) MG-SA's syntactic phrase ids, or None.

        Returns:
            The logits, (batch_size, target_len, vocab_size).
        """
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            word_ids=word_ids,
            head_word_ids=head_word_ids,
            phrase_ids=phrase_ids,
            pr_phrase_ids=pr_phrase_ids,
            local_phrase_start=local_phrase_start,
            local_phrase_end=local_phrase_end,
            tree_depth=tree_depth,
            use_cache=False,
        ).logits


def example_graph_inputs(model: nn.Module, example_inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The graph's inputs from a processor batch: its tokens, mask and the syntax fields the encoder reads, with
    `decoder_input_ids` as given or made from `labels` (shifted right, as in training)."""
    config = model.config
    inputs = dict(example_inputs)
    if inputs.get("decoder_input_ids") is None:
        if inputs.get("labels") is None:
            raise ValueError(
                "`example_inputs` needs `decoder_input_ids` or `labels`: pass a processor batch made with "
                "`text_target=...`."
            )
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(inputs["labels"])
    if inputs.get("attention_mask") is None:
        inputs["attention_mask"] = inputs["input_ids"].ne(config.pad_token_id).long()
    missing = [name for name in onnx_input_names(config) if inputs.get(name) is None]
    if missing:
        raise ValueError(
            f'encoder_type="{config.encoder_type}" reads {missing}, which `example_inputs` lacks: pass the output of '
            "`MgsaProcessor` (e.g. `processor(texts, text_target=targets, return_tensors='pt')`)."
        )
    return {name: torch.as_tensor(inputs[name]).long() for name in onnx_input_names(config)}


def export_onnx(
    model: nn.Module,
    output_path: str | Path,
    example_inputs: Mapping[str, torch.Tensor],
    *,
    opset_version: int | None = None,
    external_data: bool | None = None,
    optimize: bool = True,
) -> Path:
    """
    Write `model` ([`MgsaForConditionalGeneration`] or [`MgsaT5ForConditionalGeneration`], any encoder type) to
    `output_path` as an ONNX graph of its teacher-forced forward, traced with `torch.onnx.export(dynamo=True)`.

    The graph's inputs are named as the model's arguments ([`onnx_input_names`]): `input_ids`, `attention_mask`
    `(batch, source_length)`, `decoder_input_ids` `(batch, target_length)` and the source syntax fields the encoder
    type reads ([`onnx_syntax_fields`]; `phrase_ids` is `(batch, levels, source_length)` with the config's levels);
    its output `logits` is `(batch, target_length, vocab_size)`. Batch and both lengths are dynamic.

    Args:
        model: the model; exported in eval mode (its mode is restored afterwards).
        output_path: the `.onnx` file to write.
        example_inputs: a processor batch to trace with, `processor(texts, text_target=targets,
            return_tensors="pt")`: at least two sentences, each side at least two tokens long (a size-1 axis would be
            fixed in the graph). `decoder_input_ids` are taken from it or made from its `labels`.
        opset_version: the ONNX opset (None: the exporter's default).
        external_data: store the weights in a separate `<output_path>.data` file (None: only past ONNX's 2 GB
            limit).
        optimize: run the exporter's graph optimisation (constant folding, redundancy elimination).

    Returns:
        The path written.
    """
    check_onnx_exportable(model.config)
    inputs = example_graph_inputs(model, example_inputs)
    batch_size, source_length = inputs["input_ids"].shape
    target_length = inputs["decoder_input_ids"].shape[1]
    if min(batch_size, source_length, target_length) < 2:
        raise ValueError(
            f"`example_inputs` has batch size {batch_size}, source length {source_length} and target length "
            f"{target_length}: export from at least 2 sentences of at least 2 tokens each side, so that these axes "
            "stay dynamic."
        )
    batch = torch.export.Dim("batch")
    source = torch.export.Dim("source_length")
    target = torch.export.Dim("target_length")
    dynamic_shapes = {name: {0: batch, 1: source} for name in inputs}
    dynamic_shapes["decoder_input_ids"] = {0: batch, 1: target}
    if "phrase_ids" in inputs:
        dynamic_shapes["phrase_ids"] = {0: batch, 2: source}

    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        # the exporter's progress messages (some onnxscript releases print them) go to stderr, not the caller's stdout
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            program = torch.onnx.export(
                Seq2SeqLogits(model).eval(),
                (),
                kwargs=inputs,
                dynamic_shapes=dynamic_shapes,
                output_names=["logits"],
                opset_version=opset_version,
                optimize=optimize,
                dynamo=True,
                verbose=False,
            )
    finally:
        model.train(was_training)
    program.save(output_path, external_data=external_data)
    return output_path


def onnx_inputs(batch: Mapping[str, torch.Tensor], input_names: list[str]) -> dict:
    """The arrays an onnxruntime session of an exported graph takes, from a processor batch that holds its inputs
    (`input_names`: `[i.name for i in session.get_inputs()]`)."""
    missing = [name for name in input_names if batch.get(name) is None]
    if missing:
        raise ValueError(f"The graph reads {missing}, which the batch lacks: pass the output of `MgsaProcessor`.")
    return {name: torch.as_tensor(batch[name]).long().numpy() for name in input_names}


def as_marian(model) -> "transformers.MarianMTModel":  # noqa: F821
    """The [`~transformers.MarianMTModel`] that computes what a plain-Transformer [`MgsaForConditionalGeneration`]
    computes: the same config fields and, as the parameter names are Marian's, the same weights."""
    from transformers import MarianConfig, MarianMTModel

    marian_fields = set(MarianConfig().to_dict()) - {"model_type", "architectures", "transformers_version"}
    config = MarianConfig(**{key: value for key, value in model.config.to_dict().items() if key in marian_fields})
    marian = MarianMTModel(config)
    marian.load_state_dict(model.state_dict(), strict=True)
    return marian.eval()


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            'CTranslate2 export needs the `ctranslate2` package: pip install "mgsa-hf[export]"'
        ) from error
    return ctranslate2


def _marian_loader():
    """A CTranslate2 loader for a Marian model as Transformers runs it, whatever its vocabulary layout.

    CTranslate2's own `MarianMTLoader` is written for opus-mt conversions, where `<pad>` is the last token, added by
    Transformers for the decoder start: it drops the last vocabulary entry and its embedding rows, and starts the
    decoder from a zero vector, as Marian C++ does. This package's tokenizers put `<pad>` at id 2, and a model trained
    with tied embeddings moves the `<pad>` row away from zero, so this loader keeps every token and starts the decoder
    from the decoder start token's embedding, as `MarianMTModel.generate` does. The layers load as in `BartLoader`,
    with Marian's post-norm and no embedding layer norm.
    """
    from ctranslate2.converters.transformers import BartLoader

    class MarianAsRunLoader(BartLoader):
        @property
        def architecture_name(self):
            return "MarianMTModel"

        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

        def set_config(self, config, model, tokenizer):
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

    return MarianAsRunLoader()


def export_ctranslate2(
    model_path: str | Path, output_dir: str | Path, *, quantization: str | None = None, overwrite: bool = False,
    force: bool = False,
) -> Path:
    """
    Write a CTranslate2 model of the saved `encoder_type="transformer"` MGSA folder `model_path` (Marian backbone,
    one vocabulary for both sides) to `output_dir`, through the [`~transformers.MarianMTModel`] it equals
    ([`as_marian`]) and CTranslate2's Transformer spec. CTranslate2 takes and returns token strings: give it
    `tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)` (see [`translate_ctranslate2`]).

    Args:
        model_path: a folder written by `save_pretrained` (model and tokenizer, as `mgsa-hf train` saves them).
        output_dir: the CTranslate2 model folder to write.
        quantization: CTranslate2's weight type (`"int8"`, `"float16"`, ...; None keeps float32).
        overwrite: replace the CTranslate2 model `output_dir` holds (its other files are kept); without it, a folder
            that holds files is refused. Never the model folder itself ([`export_folder`]).
        force: the former name of `overwrite`.

    Raises:
        ValueError: for another encoder type (they export to ONNX) or the T5 backbone.
    """
    from transformers import AutoConfig, AutoTokenizer

    ctranslate2 = _require_ctranslate2()
    from ..modeling_mgsa import MgsaForConditionalGeneration

    config = AutoConfig.from_pretrained(model_path)
    if getattr(config, "model_type", None) != "mgsa":
        raise ValueError(
            f"{model_path} holds a {getattr(config, 'model_type', None)!r} model: CTranslate2 export takes the Marian "
            "backbone (`mgsa`) with encoder_type=\"transformer\"; export other models to ONNX (`mgsa-hf export onnx`)."
        )
    if config.encoder_type != "transformer":
        raise ValueError(
            f'{model_path} has encoder_type="{config.encoder_type}": CTranslate2\'s Transformer spec has plain '
            "multi-head attention only, so only encoder_type=\"transformer\" converts; export this model to ONNX "
            "(`mgsa-hf export onnx`, or `mgsa_hf.export.export_generation_onnx` in Python)."
        )
    if config.decoder_vocab_size not in (None, config.vocab_size):
        raise ValueError(
            f"{model_path} has a target vocabulary of {config.decoder_vocab_size} tokens and a source one of "
            f"{config.vocab_size}: CTranslate2's Marian form shares one vocabulary."
        )
    model = MgsaForConditionalGeneration.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(
            f"The tokenizer in {model_path} has {len(tokenizer)} tokens, the model's vocabulary {config.vocab_size}."
        )
    marian = as_marian(model)
    loader = _marian_loader()

    class MarianModelConverter(ctranslate2.converters.Converter):
        def _load(self):
            with torch.no_grad():
                return loader(marian, tokenizer)

    with export_folder(output_dir, model_path, overwrite or force, CT2_FOLDER_FILES) as staging:
        # CTranslate2 removes the folder it writes before writing: its staging folder, not `output_dir`
        MarianModelConverter().convert(str(staging), quantization=quantization, force=True)
    return Path(output_dir)


def translate_ctranslate2(
    translator, tokenizer, texts: list[str], max_length: int | None = None, **options
) -> list[str]:
    """
    Translate `texts` with a `ctranslate2.Translator` of an [`export_ctranslate2`] folder and the model's tokenizer:
    source tokens as the tokenizer makes them (EOS included, truncated to `max_length` tokens when given), the best
    hypothesis decoded without special tokens. `options` go to `translate_batch` (`beam_size`, `max_batch_size`,
    `max_decoding_length`, ...).
    """
    encoded = tokenizer(list(texts), truncation=max_length is not None, max_length=max_length)["input_ids"]
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded]
    results = translator.translate_batch(sources, **options)
    return [
        tokenizer.decode(tokenizer.convert_tokens_to_ids(result.hypotheses[0]), skip_special_tokens=True)
        for result in results
    ]
