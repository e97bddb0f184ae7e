"""`mgsa-hf translate`, `evaluate`, `convert` and `export`: what a user does with a saved model folder. Each command
is an `add_*_arguments(parser)` and a `run_*(args)`; `mgsa_hf.cli` wires them up and turns user errors into one line.
"""

import argparse
import contextlib
import importlib
import io
import json
import sys
from pathlib import Path


ONNX_MISSING = ("{what} needs the ONNX generation export (`mgsa_hf.export`) and onnxruntime: install the "
                "package with its export extra, `pip install 'mgsa-hf[export]'` ({error}).")


def _onnx_generation(what: str):
    """`mgsa_hf.export.onnx_generation`, imported only when a command needs it; a missing module or onnxruntime is one
    clear `ImportError`."""
    try:
        import onnxruntime  # noqa: F401

        onnx_generation = importlib.import_module("..export.onnx_generation", __package__)
    except ImportError as error:
        raise ImportError(ONNX_MISSING.format(what=what, error=error)) from error
    return onnx_generation


def is_onnx_folder(folder: str | Path) -> bool:
    """Whether `folder` is an ONNX folder (`mgsa-hf export onnx` wrote its `encoder_model.onnx`), not a model
    folder."""
    return (Path(folder) / "encoder_model.onnx").is_file()


def add_trust_remote_code_argument(parser) -> None:
    """`--trust-remote-code`: load a saved processor whose settings name code to run."""
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="load the folder's processor even where its settings name code to run (a tree_parser "
                             "import path, parser_code), and a model type only the folder's own code defines; "
                             "without it such a folder is refused")


def check_processor_trust(folder: str | Path, args) -> None:
    """Refuse the processor saved in `folder` when its settings name code to run, unless `--trust-remote-code`:
    before anything is loaded, with the command line's advice."""
    from ..training.conversion import saved_processor_settings

    saved_processor_settings(str(folder), trust_remote_code=args.trust_remote_code, option="--trust-remote-code")


def load_onnx_folder(folder: str | Path, args, what: str):
    """The `OrtMgsaForConditionalGeneration` of an ONNX folder, checked against the export's record, and its
    processor: what `translate` and `evaluate` run."""
    from ..processing_mgsa import MgsaProcessor

    onnx_generation = _onnx_generation(what)
    check_processor_trust(folder, args)
    model = onnx_generation.OrtMgsaForConditionalGeneration.from_pretrained(folder, threads=args.threads)
    return model, MgsaProcessor.from_pretrained(folder, trust_remote_code=args.trust_remote_code)


def load_model_folder(folder: str | Path, args) -> tuple:
    """The model of a saved folder (`AutoModelForSeq2SeqLM`, with the package's classes registered) and the keyword
    giving the pipeline its processor (`processor=`), or its tokenizer alone (`tokenizer=`) where the folder has no
    saved processor and the model reads no syntax. Loaded here, before the pipeline, so that an error is the load's
    own: `pipeline(model=folder)` wraps it in the tracebacks of every model class it tried. A saved processor that
    names code, and the folder's own model code, are loaded only with `--trust-remote-code`.

    Raises:
        ValueError: naming the file, for damaged weights or another model's tokenizer in the folder (see
            [`~mgsa_hf.weights_checksums`]); `OSError` naming the tokenizer file the folder lacks.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from .. import register_auto_classes
    from ..processing_mgsa import MgsaProcessor
    from ..saved_files import check_processor_files
    from ..tokenization_utils import missing_tokenizer_files

    register_auto_classes()
    check_processor_trust(folder, args)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=args.trust_remote_code)
    if (Path(folder) / "processor_config.json").is_file() or getattr(model.config, "reads_source_syntax", False):
        return model, {"processor": MgsaProcessor.from_pretrained(folder, trust_remote_code=args.trust_remote_code)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # a damaged file, named with its line; else a file the folder lacks
        check_processor_files(folder)
        if (problem := missing_tokenizer_files(folder)) is None:
            raise
        raise OSError(problem) from error
    return model, {"tokenizer": tokenizer}


def translation_pipeline(folder: str, args, device: str = "cpu"):
    """The translation pipeline of a model folder ([`load_model_folder`]), or of an ONNX folder's onnxruntime model
    ([`load_onnx_folder`]); it refuses a tokenizer that is not the model's (its `config.json` record)."""
    from transformers import pipeline

    from .. import pipeline_translation  # noqa: F401  (registers the translation pipeline)

    if is_onnx_folder(folder):
        model, processor = load_onnx_folder(folder, args, "running an ONNX folder")
        return pipeline("translation", model=model, processor=processor)
    model, preprocessing = load_model_folder(folder, args)
    return pipeline("translation", model=model, device=device, **preprocessing)


# translate ----------------------------------------------------------------------------------------------------

TRANSLATE_DESCRIPTION = """Translate sentences (one per line) with a saved model folder, in batches, through the
translation pipeline; an ONNX folder (one with encoder_model.onnx, written by `mgsa-hf export onnx`) is run with
onnxruntime.

Lines end at a line feed (the \\r of a \\r\\n ending is dropped): every input line gives one output line. Decoding
follows the folder's generation config (beam size, length bound) unless --num-beams, --max-length or
--max-new-tokens say otherwise. A line longer than the model's positions stops the run with an error naming it,
unless --truncation or --max-source-length cut it.

    echo "A man rides a bike." | mgsa-hf translate runs/mgsa-multi30k
    mgsa-hf translate runs/mgsa-multi30k --input test.en --output test.hyp.de --num-beams 4
"""


def add_translate_arguments(parser) -> None:
    """The arguments of `mgsa-hf translate`: the model or ONNX folder, input and output files, batching, decoding."""
    from ..training.config import positive_int

    parser.add_argument("model", help="saved model folder (model + processor), or an ONNX folder")
    parser.add_argument("--input", help="file of source sentences (default: standard input)")
    parser.add_argument("--output", help="file for the translations (default: standard output)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="sentences per batch (default: 32)")
    parser.add_argument("--num-beams", type=positive_int, help="beam size (default: the model's generation config)")
    parser.add_argument("--max-length", type=positive_int,
                        help="most tokens of a translation, EOS included (default: the model's generation config)")
    parser.add_argument("--max-new-tokens", type=positive_int,
                        help="most tokens of a translation, instead of --max-length (default: the model's "
                             "generation config)")
    parser.add_argument("--max-source-length", type=positive_int,
                        help="cut source sentences to this many tokens (default: none is cut)")
    parser.add_argument("--truncation", action="store_true",
                        help="cut source sentences to the tokenizer's model_max_length, or to the model's positions "
                             "where they are fewer (default: none is cut)")
    parser.add_argument("--device", default="cpu", help="torch device of the model (default: cpu)")
    add_threads_argument(parser)
    add_trust_remote_code_argument(parser)


def add_threads_argument(parser) -> None:
    """`--threads N`: the CPU threads that decoding uses (default: torch's or onnxruntime's own)."""
    from ..training.config import positive_int

    parser.add_argument("--threads", type=positive_int,
                        help="CPU threads of torch (or of onnxruntime, for an ONNX folder) (default: theirs, one per "
                             "core; on a busy machine 1 is often faster)")


def _apply_process_settings(args) -> None:
    """`--threads`, and on CPU glibc's allocator told to keep what decoding frees: each step's scores over the
    vocabulary (a batch of 32 at beam 4 with 32k tokens: 16 MiB a tensor, several a step) would otherwise be mapped and
    faulted in afresh (`benchmarks/BENCHMARKS.md`, "How fast serving could be")."""
    if getattr(args, "device", "cpu") == "cpu":
        from ..training.cpu_memory import reuse_freed_cpu_memory

        reuse_freed_cpu_memory()
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def split_input_lines(source) -> list[str]:
    """The lines of a text stream opened with `newline=""`, split at `\\n` only, without their `\\n` or `\\r\\n`."""
    lines = source.read().split("\n")
    if lines[-1] == "":  # the last line's line feed, or an empty input
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _read_sources(path: str | None) -> list[str]:
    if path:  # lines as `split_input_lines` cuts them; bytes that are not UTF-8 named by file and line
        from ..tokenization_utils import read_lines

        return list(read_lines(path))
    if hasattr(sys.stdin, "buffer"):  # standard input, without Python's universal newlines
        return split_input_lines(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline=""))
    return split_input_lines(sys.stdin)


def _onnx_translations(folder: str, sentences: list[str], args, options: dict):
    """Batches of an ONNX folder's translations through `OrtMgsaForConditionalGeneration.generate`."""
    model, processor = load_onnx_folder(folder, args, "translating an ONNX folder")
    cut = {"truncation": True, "max_length": options.pop("max_source_length")} if "max_source_length" in options \
        else {"truncation": options.pop("truncation", False)}
    for start in range(0, len(sentences), args.batch_size):
        inputs = processor(sentences[start:start + args.batch_size], return_tensors="pt", **cut)
        yield from processor.tokenizer.batch_decode(model.generate(**inputs, **options), skip_special_tokens=True)


def run_translate(args) -> None:
    """`mgsa-hf translate`: write one translation per input line, through the pipeline or onnxruntime."""
    from tqdm import tqdm

    from ..pipeline_translation import SourceTooLongError

    if not Path(args.model).is_dir():
        raise FileNotFoundError(f"model folder {args.model!r} does not exist.")
    _apply_process_settings(args)
    sentences = _read_sources(args.input)
    options = {name: getattr(args, name) for name in ("num_beams", "max_length", "max_new_tokens", "max_source_length")
               if getattr(args, name) is not None}
    if args.truncation:
        options["truncation"] = True
    if is_onnx_folder(args.model):
        translations = _onnx_translations(args.model, sentences, args, options)
    else:
        translator = translation_pipeline(args.model, args, args.device)
        # a generator in, translations streamed out as each batch is done
        rows = translator((sentence for sentence in sentences), batch_size=args.batch_size, **options)
        translations = (row["translation_text"] for (row,) in rows)
    output = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for translation in tqdm(translations, total=len(sentences), desc="translating", unit="sentence",
                                disable=args.input is None):
            _write(output, translation + "\n", args.output)
        _write(output, None, args.output)  # flushed (and closed, a file): a full disk named there too
    except SourceTooLongError as error:
        line = sentences.index(error.sentence) + 1
        raise SystemExit(
            f"translate: error: {args.input or '<stdin>'}, line {line}: {error.num_tokens} tokens, more than the "
            f"model's {error.limit} positions: pass --truncation or --max-source-length {error.limit} to cut it."
        ) from None
    finally:
        if output is not sys.stdout:
            with contextlib.suppress(OSError):  # after an error, which was named
                output.close()


def _write(output, text: str | None, path: str | None) -> None:
    """Writes `text` to `output` (`None`: flushes it, and closes it unless it is standard output); an `OSError` (a
    full disk, ...) names `path`, raised from the system's error."""
    try:
        if text is not None:
            output.write(text)
        elif output is sys.stdout:
            output.flush()
        else:
            output.close()
    except OSError as error:
        raise OSError(error.errno, f"cannot write the translations to {path or '<stdout>'}: "
                                   f"{error.strerror or error}") from error


# evaluate ----------------------------------------------------------------------------------------------------

EVALUATE_DESCRIPTION = """Score a saved model folder (or an ONNX folder, written by `mgsa-hf export onnx`, run with
onnxruntime) on a split of a corpus folder through the translation pipeline, with the folder's own decoding (its
generation config) unless --num-beams says otherwise, and sources longer than the model's positions cut there (as
training scores its splits): sacreBLEU's BLEU and chrF with the BLEU signature, the share of distinct translations,
and the BLEU the folder's model card states for that split, printed as JSON.

    mgsa-hf evaluate runs/mgsa-multi30k --data path/to/multi30k --split test_2016_flickr
"""


def add_evaluate_arguments(parser) -> None:
    """The arguments of `mgsa-hf evaluate`: the model folder, the corpus folder and split, decoding."""
    from ..training.catalogue import DATA_ENV, default_data
    from ..training.config import positive_int

    parser.add_argument("folder", help="saved model folder (model + processor), or an ONNX folder")
    parser.add_argument("--data", default=default_data(),
                        help=f"corpus folder of {{split}}.{{lang}}[.gz] files (default: ${DATA_ENV}/multi30k where "
                             "set, else ../shared/data/multi30k; here %(default)s)")
    parser.add_argument("--split", default="test_2016_flickr", help="the split's file name (default: %(default)s)")
    parser.add_argument("--source-lang", default="en", help="(default: %(default)s)")
    parser.add_argument("--target-lang", default="de", help="(default: %(default)s)")
    parser.add_argument("--max-samples", type=positive_int, help="score the first N pairs only (default: all)")
    parser.add_argument("--num-beams", type=positive_int, help="beam size (default: the model's generation config)")
    parser.add_argument("--batch-size", type=positive_int, default=100, help="(default: %(default)s)")
    parser.add_argument("--output", help="also write the report as JSON here")
    add_threads_argument(parser)
    add_trust_remote_code_argument(parser)


def run_evaluate(args) -> dict:
    """`mgsa-hf evaluate`: BLEU, chrF and the card's BLEU of the folder's model on a split; prints and returns them."""
    from ..evaluation import translation_scores
    from ..tokenization_utils import read_lines
    from ..training.catalogue import missing_data_message
    from ..training.data import find_split_file

    if not Path(args.folder).is_dir():
        raise FileNotFoundError(f"model folder {args.folder!r} does not exist.")
    if not Path(args.data).is_dir():
        raise FileNotFoundError(missing_data_message(args.data, "--data FOLDER (of {split}.{lang}[.gz] files)"))
    _apply_process_settings(args)
    sources, references = (list(read_lines(find_split_file(Path(args.data), args.split, lang)))
                           for lang in (args.source_lang, args.target_lang))
    if len(sources) != len(references):
        raise ValueError(f"split {args.split!r} of {args.data}: {len(sources)} source lines but {len(references)} "
                         "reference lines.")
    sources, references = sources[:args.max_samples], references[:args.max_samples]
    translator = translation_pipeline(args.folder, args)
    options = {"truncation": True, **({"num_beams": args.num_beams} if args.num_beams else {})}
    translations = [row["translation_text"] for row in translator(sources, batch_size=args.batch_size, **options)]
    scores = translation_scores(translations, references)
    report = {"folder": args.folder, "data": args.data, "split": args.split, "sentences": len(sources),
              "bleu": scores["bleu"], "chrf": scores["chrf"], "distinct_fraction": scores["distinct_fraction"],
              "num_beams": args.num_beams or translator.model.generation_config.num_beams,
              "bleu_signature": scores["bleu_signature"], "card_bleu": _card_bleu(args)}
    print(json.dumps(report, indent=2))
    if args.output:
        try:
            Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as error:  # a full disk, ...: the path named
            raise OSError(error.errno,
                          f"cannot write the report to {args.output}: {error.strerror or error}") from error
    return report


def _card_bleu(args) -> float | None:
    """The BLEU the folder's model card states for the split scored (its `model-index`, which names the split as the
    card's dataset does: the Hub's `validation` and `test` for Multi30k's `val` and `test_2016_flickr`), or None."""
    from huggingface_hub import ModelCard

    from ..training.model_card import card_dataset

    card_file = Path(args.folder) / "README.md"
    if not card_file.is_file():
        return None
    card = ModelCard.load(card_file)
    dataset = card_dataset(args.data, args.source_lang, args.target_lang, [args.split])
    names = {args.split, dataset.split_name(args.split)}
    return next((result.metric_value for result in card.data.eval_results or []
                 if result.metric_type == "bleu" and result.dataset_split in names), None)


# convert ----------------------------------------------------------------------------------------------------

def add_convert_arguments(parser) -> None:
    """The arguments of `mgsa-hf convert` ([`convert_arguments.add_convert_arguments`])."""
    from .convert_arguments import add_convert_arguments as add

    add(parser)


def run_convert(args) -> None:
    """`mgsa-hf convert`: a Marian checkpoint (folder or Hub id) to a model folder of another encoder type."""
    from ..training.conversion import check_folder_or_hub_id, convert_checkpoint
    from .convert_arguments import parse_set_fields

    check_folder_or_hub_id(args.marian, "marian")
    report = convert_checkpoint(args.marian, args.output_dir, encoder_type=args.encoder_type,
                                new_modules_init=args.new_modules_init, trust_remote_code=args.trust_remote_code,
                                overwrite=args.overwrite, **parse_set_fields(args.set))
    print(json.dumps(report, indent=2))


# export ----------------------------------------------------------------------------------------------------

def add_export_arguments(parser) -> None:
    """The `onnx` and `ct2` subcommands of `mgsa-hf export` and their arguments."""
    from .convert_arguments import add_overwrite_argument

    formats = parser.add_subparsers(dest="format", required=True, metavar="{onnx,ct2}",
                                    parser_class=type(parser))
    onnx = formats.add_parser(
        "onnx", help="encoder and decoder graphs that `mgsa-hf translate` and OrtMgsaForConditionalGeneration run "
                     "with onnxruntime (any encoder type)",
        description="Export a saved model folder to an ONNX folder (encoder_model.onnx, the decoder's graphs, the "
                    "processor's files) that generates with onnxruntime.")
    onnx.add_argument("folder", help="saved model folder (model + processor)")
    onnx.add_argument("output_dir", help="the ONNX folder to write")
    onnx.add_argument("--int8", action="store_true", help="quantize the weights to int8 (dynamic quantization)")
    add_trust_remote_code_argument(onnx)
    add_overwrite_argument(onnx, "replace the ONNX export that output_dir holds (graphs, config, processor files; its "
                                 "other files are kept)")
    onnx.set_defaults(export=_export_onnx)
    ct2 = formats.add_parser(
        "ct2", help="a CTranslate2 model (encoder_type transformer, Marian backbone)",
        description="Convert a saved encoder_type=transformer folder (Marian backbone) to a CTranslate2 model; the "
                    "other encoder types have no CTranslate2 form: export them with `mgsa-hf export onnx`.")
    ct2.add_argument("folder", help="saved model folder (model and tokenizer)")
    ct2.add_argument("output_dir", help="the CTranslate2 model folder to write")
    ct2.add_argument("--quantization", default=None,
                     help="CTranslate2 weight type: int8, int8_float32, int16, float16, bfloat16 (default float32)")
    add_overwrite_argument(ct2, "replace the CTranslate2 model that output_dir holds (its other files are kept)")
    ct2.add_argument("--force", action="store_true", dest="overwrite", help=argparse.SUPPRESS)  # the former name
    ct2.set_defaults(export=_export_ct2)
    for subparser in (onnx, ct2):
        subparser.add_argument("--debug", action="store_true", help="show the traceback of an error")


def _check_export_folders(args) -> None:
    """The model folder exists, and the export folder is neither it nor one holding files without `--overwrite`:
    checked before the model is read."""
    from ..training.ownership import check_output_folder

    if not Path(args.folder).is_dir():
        raise FileNotFoundError(f"model folder {args.folder!r} does not exist.")
    check_output_folder(args.output_dir, source=args.folder, overwrite=args.overwrite)


def _export_onnx(args) -> dict:
    from ..export import ONNX_FOLDER_FILES, export_folder

    onnx_generation = _onnx_generation("mgsa-hf export onnx")
    _check_export_folders(args)
    check_processor_trust(args.folder, args)
    with export_folder(args.output_dir, args.folder, args.overwrite, ONNX_FOLDER_FILES) as staging:
        onnx_generation.export_generation_onnx(args.folder, staging, quantize=args.int8,
                                               trust_remote_code=args.trust_remote_code)
    return {"model": args.folder, "output_dir": str(args.output_dir), "int8": args.int8}


def _export_ct2(args) -> dict:
    from ..export import export_ctranslate2

    _check_export_folders(args)
    path = export_ctranslate2(args.folder, args.output_dir, quantization=args.quantization, overwrite=args.overwrite)
    return {"model": args.folder, "output_dir": str(path), "quantization": args.quantization or "float32"}


def run_export(args: argparse.Namespace) -> dict:
    """`mgsa-hf export onnx|ct2`: export the folder as the subcommand says; prints and returns the report."""
    report = args.export(args)
    print(json.dumps(report))
    return report
