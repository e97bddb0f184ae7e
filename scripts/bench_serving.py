#!/usr/bin/env python
"""CPU serving speed of every encoder type: PyTorch `generate`, ONNX Runtime (fp32 and int8) and, for the plain
Transformer, CTranslate2.

For each encoder type, the same test 2016 sentences, in the same batches made beforehand by the model's processor
(parse included, outside the timing), are translated by every engine at each beam size, batch size and thread count;
each engine translates a warm-up batch first. Reported per row: seconds, sentences per second, the speed-up over
PyTorch `generate` with the same settings, sacreBLEU BLEU against the references and the share of translations
identical to `generate`'s. ONNX folders come from `mgsa_hf.export.onnx_generation.export_generation_onnx` (the encoder
graph and the decoder graphs with past key/values), read by `OrtMgsaForConditionalGeneration`; `ort-search` folders
from `mgsa_hf.export.onnx_search.export_search_onnx` (the whole search in one onnxruntime call),
read by `OrtSearchModel`.

Models: trained folders (`--model TYPE=FOLDER`, e.g. `mgsa-hf train model.encoder_type=rhe output_dir=...`), or, for
the types given none, a freshly initialised model per type and backbone (`--backbones marian t5`; CTranslate2 only
for the Marian Transformer) at `--size`: `default`, the default training recipe's (`mgsa-hf train`: 128 wide, 4+4
layers, 4 heads, FFN 256), or `base`, Transformer-base (512 wide, 6+6 layers, 8 heads, FFN 2048); `--model-fields`
overrides single fields. Their processor is `--processor`'s, or one built under `--work-dir` with a joint tokenizer of
`--vocab-size` tokens trained on Multi30k's train split (the fresh models' vocabulary is `--vocab-size` even where
that text yields fewer tokens: about 20k of 32k). Random weights: speeds count, BLEU does not; give
`--fixed-new-tokens N` so that every sentence gets exactly N new tokens (else generation stops at EOS, which random
weights reach at different steps in each type). Every type is at its default config.

Per row also: `cpu_ms_per_sentence`, the CPU time (user + system) of the process and its finished children over the
timed translation, per sentence; and for the types that read syntax, `end_to_end_sentences_per_second`, text in and
translation out: the processor's call on the batches (spaCy parse included, timed once per type and batch size, after
a warm-up sentence) added to the row's translation time.

Results go to `--output` (JSON, default benchmarks/serving-cpu.json) and a markdown table beside it after every row;
a rerun skips the rows already there (delete the file to start over).

    python scripts/bench_serving.py --processor runs/mgsa-multi30k --sentences 200     # every type, fresh models
    python scripts/bench_serving.py --model transformer=runs/mgsa-multi30k --model rhe=runs/rhe-multi30k

Transformer-base, both backbones, a 32k vocabulary, 32 new tokens per sentence (the base-size table; a quiet machine
with at least 2 cores; the first command also builds the processor and the fresh models under `--work-dir`):

    python scripts/bench_serving.py --size base --vocab-size 32000 --backbones marian t5 --fixed-new-tokens 32 \
        --sentences 128 --batch-sizes 32 --beams 4 1 --threads 1 2 --work-dir runs/serving-base \
        --output benchmarks/serving-cpu-base.json
    python scripts/bench_serving.py --size base --vocab-size 32000 --backbones marian t5 --fixed-new-tokens 32 \
        --sentences 16 --batch-sizes 1 --beams 4 1 --threads 1 2 --work-dir runs/serving-base \
        --output benchmarks/serving-cpu-base.json
"""

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"
# every encoder type at its default config (MG-SA: syntactic phrases, SANs composition, ON-LSTM interaction; PR: its
# default segmentation)
TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]
# ort-search: the whole search in one onnxruntime call (`mgsa_hf.export.onnx_search`)
ENGINES = ["pytorch", "ort-fp32", "ort-int8", "ort-search", "ctranslate2"]
BACKBONES = ["marian", "t5"]
SIZES = ["default", "base"]


def log(message: str) -> None:
    print(f"[bench_serving {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], metavar="TYPE=FOLDER",
                        help="a trained folder for an encoder type (repeatable)")
    parser.add_argument("--types", nargs="+", default=TYPES, choices=TYPES)
    parser.add_argument("--backbones", nargs="+", default=["marian"], choices=BACKBONES,
                        help="the backbones of the fresh models")
    parser.add_argument("--size", default="default", choices=SIZES,
                        help="the fresh models' size: the default recipe's, or Transformer-base")
    parser.add_argument("--processor", help="the processor folder of the fresh models (default: a --model folder's, "
                        "else one built with --vocab-size tokens)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="the fresh models' vocabulary, and the tokenizer's built without --processor (8000)")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--reference", default=str(DATA / "test_2016_flickr.de.gz"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beams", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: every core")
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--fixed-new-tokens", type=int, default=None, metavar="N",
                        help="exactly N new tokens per sentence (min = max new tokens = N; replaces --max-new-tokens)")
    parser.add_argument("--model-fields", default="{}", help="JSON config fields of the fresh models (e.g. sizes)")
    parser.add_argument("--ort-spinning", action="store_true",
                        help="onnxruntime's intra-op threads spin between runs (default: they wait; see "
                             "mgsa_hf.export.onnx_generation.cpu_session_options)")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "serving-exports"),
                        help="where the fresh models and the exports are kept (reused by a rerun)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "serving-cpu.json"))
    args = parser.parse_args(argv)
    if args.fixed_new_tokens is not None:
        if args.fixed_new_tokens < 2:
            parser.error("--fixed-new-tokens must be at least 2")
        args.max_new_tokens = args.fixed_new_tokens
    return args


def default_recipe_sizes() -> dict:
    """The model section of the packaged default recipe (`mgsa-hf train`), without its encoder type."""
    import yaml

    from mgsa_hf.training.catalogue import recipe_path

    model = dict(yaml.safe_load(recipe_path("default").read_text())["model"])
    model.pop("encoder_type", None)
    return model


def model_sizes(backbone: str, size: str) -> dict:
    """The fresh models' size fields: the default recipe's (T5: heads of `d_model / heads` as in Marian) or
    Transformer-base (`mgsa_hf.benchmarking.speed.SIZES`, each backbone in its own names)."""
    if size == "base":
        from mgsa_hf.benchmarking.speed import SIZES as BASE_SIZES

        return dict(BASE_SIZES[backbone]["base"])
    sizes = default_recipe_sizes()
    if backbone == "t5":
        sizes["d_kv"] = sizes["d_model"] // sizes["encoder_attention_heads"]
    return sizes


def fresh_processor(args):
    """The processor of the fresh models: `--processor`'s, else one with a `--vocab-size` tokenizer trained on
    Multi30k's train split, built once under the work folder."""
    from mgsa_hf.processing_mgsa import MgsaProcessor

    if args.processor is not None:
        return MgsaProcessor.from_pretrained(args.processor)
    vocab_size = args.vocab_size or 8000
    folder = Path(args.work_dir) / f"processor-{vocab_size}"
    if not (folder / "processor_config.json").is_file():
        from mgsa_hf.benchmarking.speed import DEFAULT_DATA, build_processor

        log(f"training a {vocab_size}-token tokenizer into {folder}")
        build_processor(Path(args.work_dir) / f"tokenizer-{vocab_size}", DEFAULT_DATA, vocab_size).save_pretrained(
            folder)
    return MgsaProcessor.from_pretrained(folder)


def model_folder(args, encoder_type: str, backbone: str, given: dict, processor) -> Path:
    """The trained folder given for `encoder_type`, or a fresh model of `backbone` at `--size` saved under the work
    folder."""
    if encoder_type in given:
        return Path(given[encoder_type])
    from mgsa_hf.training.conversion import BACKBONES as MODEL_CLASSES

    tokenizer = processor.tokenizer
    vocab_size = max(len(tokenizer), args.vocab_size or 0)
    folder = Path(args.work_dir) / f"fresh-{backbone}-{args.size}-{vocab_size}-{encoder_type}"
    if not (folder / "config.json").is_file():
        config_class, model_class = MODEL_CLASSES[backbone]
        sizes = {**model_sizes(backbone, args.size), **json.loads(args.model_fields)}
        config = config_class(
            vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id, encoder_type=encoder_type,
            num_phrase_tags=len(processor.phrase_tags), **sizes,
        )
        torch.manual_seed(0)
        model_class(config).save_pretrained(folder)
        processor.save_pretrained(folder)
    return folder


def exported(args, folder: Path, encoder_type: str, engine: str) -> Path:
    """The ONNX or CTranslate2 folder of `folder` for `engine`, exported once into the work folder."""
    target = Path(args.work_dir) / f"{folder.name}-{encoder_type}-{engine}"
    if engine == "ort-int8" and not (target / "onnx_generation.json").is_file():
        from mgsa_hf.export.onnx_generation import quantize_generation_onnx

        quantize_generation_onnx(exported(args, folder, encoder_type, "ort-fp32"), target)
    if engine == "ort-fp32" and not (target / "onnx_generation.json").is_file():
        from mgsa_hf.export.onnx_generation import export_generation_onnx

        log(f"exporting {folder} to {target}")
        export_generation_onnx(folder, target)
    if engine == "ort-search" and not (target / "onnx_search.json").is_file():
        from transformers import AutoModelForSeq2SeqLM

        from mgsa_hf.export.onnx_search import export_search_onnx
        from mgsa_hf.processing_mgsa import MgsaProcessor

        log(f"exporting {folder} to {target}")
        model = AutoModelForSeq2SeqLM.from_pretrained(folder)
        # the settings the op needs for beam search; with a fixed number of new tokens every hypothesis ends at the
        # last step, so they change nothing there. EOS is held off before it, as `min_new_tokens` holds it off
        model.generation_config.update(early_stopping=True, forced_eos_token_id=model.config.eos_token_id,
                                       num_beams=max(2, *args.beams))
        if args.fixed_new_tokens is not None:
            model.generation_config.min_length = args.fixed_new_tokens
        export_search_onnx(model, target, processor=MgsaProcessor.from_pretrained(folder), overwrite=True)
    if engine == "ctranslate2" and not (target / "model.bin").is_file():
        from mgsa_hf.export import export_ctranslate2

        export_ctranslate2(folder, target, force=True)
    return target


def translator(args, folder: Path, encoder_type: str, engine: str, threads: int, processor):
    """A function from a list of processor batches to translations, for `engine` on `threads` threads."""
    if engine == "ctranslate2":
        import ctranslate2

        from mgsa_hf.export import translate_ctranslate2

        model = ctranslate2.Translator(str(exported(args, folder, encoder_type, engine)), device="cpu",
                                       intra_threads=threads, inter_threads=1)

        fixed = {} if args.fixed_new_tokens is None else {"min_decoding_length": args.fixed_new_tokens - 1}

        def translate(batches, beams):
            return [text for batch in batches for text in translate_ctranslate2(
                model, processor.tokenizer, batch["texts"], beam_size=beams, max_batch_size=len(batch["texts"]),
                max_decoding_length=args.max_new_tokens - 1, **fixed)]

        return translate
    if engine == "ort-search":
        from mgsa_hf.export.onnx_search import OrtSearchModel

        search = OrtSearchModel.from_pretrained(exported(args, folder, encoder_type, engine),
                                                **ort_threads(args, threads))
        return batch_translator(processor.tokenizer, lambda inputs, beams: search.generate(
            **inputs, num_beams=beams, max_new_tokens=args.max_new_tokens))
    if engine == "pytorch":
        from transformers import AutoModelForSeq2SeqLM

        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    else:
        from mgsa_hf.export.onnx_generation import OrtMgsaForConditionalGeneration

        model = OrtMgsaForConditionalGeneration.from_pretrained(exported(args, folder, encoder_type, engine),
                                                                **ort_threads(args, threads))

    # a fixed number of new tokens: every hypothesis reaches `max_new_tokens`, where EOS is forced as the one-call
    # search forces it (Marian's default; T5's generation config forces none)
    fixed = {} if args.fixed_new_tokens is None else {"min_new_tokens": args.fixed_new_tokens,
                                                      "forced_eos_token_id": model.config.eos_token_id}

    def generate(inputs, beams):
        with torch.inference_mode():
            return model.generate(**inputs, num_beams=beams, max_new_tokens=args.max_new_tokens, do_sample=False,
                                  **fixed)

    return batch_translator(processor.tokenizer, generate)


def ort_threads(args, threads: int) -> dict:
    """The thread arguments of an ONNX Runtime model's `from_pretrained`: `threads` intra-op threads, spinning
    between runs with `--ort-spinning`."""
    from mgsa_hf.export.onnx_generation import cpu_session_options

    if args.ort_spinning:
        return {"session_options": cpu_session_options(threads or None, spinning=True)}
    return {"threads": threads or None}


def batch_translator(tokenizer, generate):
    """`translate(batches, beams)`: the translations of processor batches, each batch's token ids from
    `generate(inputs, beams)` (the batch without its `texts`) decoded by `tokenizer`."""

    def translate(batches, beams):
        translations = []
        for batch in batches:
            inputs = {name: value for name, value in batch.items() if name != "texts"}
            translations += tokenizer.batch_decode(generate(inputs, beams), skip_special_tokens=True)
        return translations

    return translate


def markdown(report: dict) -> str:
    lines = [f"CPU: {report['cpu']}\n"] if "cpu" in report else []
    lines += ["| type | backbone | engine | beams | batch | threads | sentences | sent/s | speed-up | BLEU | "
              "identical | end-to-end sent/s | CPU ms/sent |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        cells = [row["encoder_type"], row.get("backbone", "marian"), row["engine"], row["beams"], row["batch_size"],
                 row["threads"], row.get("sentences", report["sentences"]), row["sentences_per_second"],
                 row.get("speedup_over_generate", ""), row["bleu"], row.get("identical_to_generate", ""),
                 row.get("end_to_end_sentences_per_second", ""), row.get("cpu_ms_per_sentence", "")]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def write(report: dict, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(report))


def cpu_seconds() -> float:
    """User + system CPU time of this process (every thread) and of its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def processor_batches(processor, sources: list[str], batch_size: int, fields) -> tuple[list[dict], float]:
    """The processor's batches of `batch_size` sentences (with their texts), with the syntax `fields` the model
    reads (as the translation pipeline makes them), and the seconds the processor took."""
    processor(sources[:1])  # warm-up: spaCy's pipeline loads once per process
    batches, start = [], time.perf_counter()
    for first in range(0, len(sources), batch_size):
        texts = sources[first: first + batch_size]
        batches.append({**processor(texts, return_tensors="pt", syntax_fields=fields), "texts": texts})
    return batches, time.perf_counter() - start


def main(argv=None) -> None:
    from transformers import AutoConfig

    from mgsa_hf.benchmarking.rows import cpu_description, recorded_command
    from mgsa_hf.export import onnx_syntax_fields
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    args = parse_args(argv)
    given = dict(item.split("=", 1) for item in args.model)
    output = Path(args.output)
    settings = {"size": args.size, "vocab_size": args.vocab_size, "fixed_new_tokens": args.fixed_new_tokens,
                "model_fields": json.loads(args.model_fields), "ort_spinning": args.ort_spinning}
    report = json.loads(output.read_text()) if output.is_file() else {
        "command": recorded_command(os.path.relpath(__file__, REPO), sys.argv[1:]),
        "sentences": args.sentences, "max_new_tokens": args.max_new_tokens, **settings, "cpu_count": os.cpu_count(),
        "machine": platform.platform(), "cpu": cpu_description(), "torch": torch.__version__, "rows": [],
        "generate_translations": {},
    }
    defaults = {"size": "default", "model_fields": {}, "ort_spinning": False}  # of reports older than the field
    recorded = {name: report.get(name, defaults.get(name)) for name in settings}
    if recorded != settings:
        raise SystemExit(f"{output} holds rows measured with {recorded}, not {settings}: give another --output, or "
                         "delete it to start over.")
    done = {(row.get("backbone", "marian"), row["encoder_type"], row["engine"], row["beams"], row["batch_size"],
             row["threads"]) for row in report["rows"]}
    sources = list(read_lines(args.source, args.sentences))
    references = list(read_lines(args.reference, args.sentences))
    if args.processor is None and given:
        args.processor = next(iter(given.values()))
    processor_for_fresh = fresh_processor(args)
    for backbone in args.backbones:
        for encoder_type in args.types:
            folder = model_folder(args, encoder_type, backbone, given, processor_for_fresh)
            config = AutoConfig.from_pretrained(folder)
            if (config.model_type == "mgsa_t5") != (backbone == "t5"):
                log(f"skipping {backbone} {encoder_type}: {folder} holds a {config.model_type} model")
                continue
            reads_syntax = bool(onnx_syntax_fields(config))
            processor = MgsaProcessor.from_pretrained(folder)
            engines = [engine for engine in args.engines
                       if engine != "ctranslate2" or (encoder_type == "transformer" and backbone == "marian")]
            for batch_size in args.batch_sizes:
                parse_cpu = cpu_seconds()
                batches, parse_seconds = processor_batches(processor, sources, batch_size,
                                                           onnx_syntax_fields(config))
                parse_cpu = cpu_seconds() - parse_cpu
                for threads in args.threads:
                    cores = threads or os.cpu_count()
                    torch.set_num_threads(cores)
                    for beams in args.beams:
                        for engine in engines:
                            key = (backbone, encoder_type, engine, beams, batch_size, cores)
                            if key in done:
                                continue
                            translate = translator(args, folder, encoder_type, engine, cores, processor)
                            translate(batches[:1], beams)  # warm-up
                            cpu, start = cpu_seconds(), time.perf_counter()
                            translations = translate(batches, beams)
                            seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
                            row = measured_row(report, key, translations, references, seconds, cpu, folder)
                            if reads_syntax:
                                row["parse_seconds"] = round(parse_seconds, 3)
                                row["end_to_end_sentences_per_second"] = round(
                                    len(sources) / (parse_seconds + seconds), 2)
                                row["end_to_end_cpu_ms_per_sentence"] = round(
                                    1000 * (parse_cpu + cpu) / len(sources), 2)
                            report["rows"].append(row)
                            done.add(key)
                            write(report, output)
                            log(f"{backbone} {encoder_type} {engine} beams={beams} batch={batch_size} "
                                f"threads={cores}: {row['sentences_per_second']} sent/s, "
                                f"x{row.get('speedup_over_generate')}")
    print(markdown(report))


def measured_row(report: dict, key: tuple, translations: list[str], references: list[str], seconds: float,
                 cpu: float, folder: Path) -> dict:
    """The report row of `key` (backbone, type, engine, beams, batch size, threads): speed, CPU time, BLEU and,
    against the `generate` row of the same settings, the speed-up and the share of identical translations (a
    `generate` row's translations are kept for the others)."""
    import sacrebleu

    backbone, encoder_type, engine, beams, batch_size, cores = key
    count = len(translations)
    row = {
        "backbone": backbone, "encoder_type": encoder_type, "engine": engine, "beams": beams,
        "batch_size": batch_size, "threads": cores, "sentences": count, "seconds": round(seconds, 3),
        "sentences_per_second": round(count / seconds, 2), "cpu_ms_per_sentence": round(1000 * cpu / count, 2),
        "bleu": round(sacrebleu.corpus_bleu(translations, [references]).score, 2),
        "load_average": round(os.getloadavg()[0], 2), "model": str(folder),
    }
    generate_key = f"{backbone}/{encoder_type}/{beams}/{batch_size}/{count}"
    if engine == "pytorch":
        report["generate_translations"][generate_key] = translations
    reference = report["generate_translations"].get(generate_key)
    if reference is not None:
        row["identical_to_generate"] = round(
            sum(a == b for a, b in zip(translations, reference, strict=True)) / count, 4)
    generate_row = next((r for r in report["rows"] if r["engine"] == "pytorch" and (
        r.get("backbone", "marian"), r["encoder_type"], r["beams"], r["batch_size"], r["threads"]
    ) == (backbone, encoder_type, beams, batch_size, cores)), None)
    if generate_row is not None:
        row["speedup_over_generate"] = round(generate_row["seconds"] / seconds, 2)
    return row


if __name__ == "__main__":
    main()
