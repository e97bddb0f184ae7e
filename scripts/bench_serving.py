#!/usr/bin/env python
"""CPU serving speed of every encoder type: PyTorch `generate`, ONNX Runtime (fp32 and int8) and, for the plain
Transformer, CTranslate2.

For each encoder type, the same test 2016 sentences, in the same batches made beforehand by the model's processor
(parse included, outside the timing), are translated by every engine at each beam size, batch size and thread count;
each engine translates a warm-up batch first. Reported per row: seconds, sentences per second, the speed-up over
PyTorch `generate` with the same settings, sacreBLEU BLEU against the references and the share of translations
identical to `generate`'s. ONNX folders come from `mgsa_hf.export.onnx_generation.export_generation_onnx` (the encoder
graph and the decoder graphs with past key/values), read by `OrtMgsaForConditionalGeneration`.

Models: trained folders (`--model TYPE=FOLDER`, e.g. `mgsa-hf train model.encoder_type=rhe output_dir=...`), or, for
the types given none, a freshly initialised model per type with the sizes of the default training recipe (`mgsa-hf
train`: 128 wide, 4+4 layers, 4 heads, FFN 256; `--model-fields` overrides them, e.g. Transformer-base) and the
processor of `--processor` (random weights: speeds count, BLEU does not; generation then runs to `--max-new-tokens`
unless EOS comes). Every type is at its default config.

Results go to `--output` (JSON, default benchmarks/serving-cpu.json) and a markdown table beside it after every row;
a rerun skips the rows already there (delete the file to start over).

    python scripts/bench_serving.py --processor runs/mgsa-multi30k --sentences 200     # every type, fresh models
    python scripts/bench_serving.py --model transformer=runs/mgsa-multi30k --model rhe=runs/rhe-multi30k
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"
# every encoder type at its default config (MG-SA: syntactic phrases, SANs composition, ON-LSTM interaction; PR: its
# default segmentation)
TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]
ENGINES = ["pytorch", "ort-fp32", "ort-int8", "ctranslate2"]


def log(message: str) -> None:
    print(f"[bench_serving {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], metavar="TYPE=FOLDER",
                        help="a trained folder for an encoder type (repeatable)")
    parser.add_argument("--types", nargs="+", default=TYPES, choices=TYPES)
    parser.add_argument("--processor", help="the processor folder of the fresh models (default: a --model folder's)")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--reference", default=str(DATA / "test_2016_flickr.de.gz"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beams", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: every core")
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model-fields", default="{}", help="JSON config fields of the fresh models (e.g. sizes)")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "serving-exports"),
                        help="where the fresh models and the exports are kept (reused by a rerun)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "serving-cpu.json"))
    return parser.parse_args(argv)


def default_recipe_sizes() -> dict:
    """The model section of the packaged default recipe (`mgsa-hf train`), without its encoder type."""
    import yaml

    from mgsa_hf.training.catalogue import recipe_path

    model = dict(yaml.safe_load(recipe_path("default").read_text())["model"])
    model.pop("encoder_type", None)
    return model


def model_folder(args, encoder_type: str, given: dict, processor) -> Path:
    """The trained folder given for `encoder_type`, or a fresh model at the default sizes saved under the work
    folder."""
    if encoder_type in given:
        return Path(given[encoder_type])
    from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration

    folder = Path(args.work_dir) / f"fresh-{encoder_type}"
    if not (folder / "config.json").is_file():
        tokenizer = processor.tokenizer
        sizes = {**default_recipe_sizes(), **json.loads(args.model_fields)}
        config = MgsaConfig(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id, encoder_type=encoder_type,
            num_phrase_tags=len(processor.phrase_tags), **sizes,
        )
        torch.manual_seed(0)
        MgsaForConditionalGeneration(config).save_pretrained(folder)
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

        def translate(batches, beams):
            return [text for batch in batches for text in translate_ctranslate2(
                model, processor.tokenizer, batch["texts"], beam_size=beams, max_batch_size=len(batch["texts"]),
                max_decoding_length=args.max_new_tokens - 1)]

        return translate
    if engine == "pytorch":
        from transformers import AutoModelForSeq2SeqLM

        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    else:
        from mgsa_hf.export.onnx_generation import OrtMgsaForConditionalGeneration

        model = OrtMgsaForConditionalGeneration.from_pretrained(exported(args, folder, encoder_type, engine),
                                                                threads=threads or None)

    def translate(batches, beams):
        translations = []
        for batch in batches:
            inputs = {name: value for name, value in batch.items() if name != "texts"}
            with torch.inference_mode():
                output = model.generate(**inputs, num_beams=beams, max_new_tokens=args.max_new_tokens,
                                        do_sample=False)
            translations += processor.tokenizer.batch_decode(output, skip_special_tokens=True)
        return translations

    return translate


def markdown(report: dict) -> str:
    lines = ["| type | engine | beams | batch | threads | sentences | sent/s | speed-up | BLEU | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        cells = [row["encoder_type"], row["engine"], row["beams"], row["batch_size"], row["threads"],
                 row.get("sentences", report["sentences"]), row["sentences_per_second"],
                 row.get("speedup_over_generate", ""), row["bleu"], row.get("identical_to_generate", "")]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def write(report: dict, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(report))


def main(argv=None) -> None:
    import sacrebleu

    from mgsa_hf.benchmarking.rows import recorded_command
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    args = parse_args(argv)
    given = dict(item.split("=", 1) for item in args.model)
    output = Path(args.output)
    report = json.loads(output.read_text()) if output.is_file() else {
        "command": recorded_command(os.path.relpath(__file__, REPO), sys.argv[1:]),
        "sentences": args.sentences, "max_new_tokens": args.max_new_tokens, "cpu_count": os.cpu_count(),
        "machine": platform.platform(), "torch": torch.__version__, "rows": [], "generate_translations": {},
    }
    done = {(row["encoder_type"], row["engine"], row["beams"], row["batch_size"], row["threads"])
            for row in report["rows"]}
    sources = list(read_lines(args.source, args.sentences))
    references = list(read_lines(args.reference, args.sentences))
    processor_folder = args.processor or next(iter(given.values()), None)
    if processor_folder is None:
        raise SystemExit("give --processor (for fresh models) or --model TYPE=FOLDER")
    fresh_processor = MgsaProcessor.from_pretrained(processor_folder)
    for encoder_type in args.types:
        folder = model_folder(args, encoder_type, given, fresh_processor)
        processor = MgsaProcessor.from_pretrained(folder)
        engines = [engine for engine in args.engines if engine != "ctranslate2" or encoder_type == "transformer"]
        for batch_size in args.batch_sizes:
            batches = []
            for start in range(0, len(sources), batch_size):
                texts = sources[start: start + batch_size]
                batches.append({**processor(texts, return_tensors="pt"), "texts": texts})
            for threads in args.threads:
                cores = threads or os.cpu_count()
                torch.set_num_threads(cores)
                for beams in args.beams:
                    for engine in engines:
                        key = (encoder_type, engine, beams, batch_size, cores)
                        if key in done:
                            continue
                        translate = translator(args, folder, encoder_type, engine, cores, processor)
                        translate(batches[:1], beams)  # warm-up
                        start = time.perf_counter()
                        translations = translate(batches, beams)
                        seconds = time.perf_counter() - start
                        generate_key = f"{encoder_type}/{beams}/{batch_size}/{len(sources)}"
                        if engine == "pytorch":
                            report["generate_translations"][generate_key] = translations
                        row = {
                            "encoder_type": encoder_type, "engine": engine, "beams": beams, "batch_size": batch_size,
                            "threads": cores, "sentences": len(sources), "seconds": round(seconds, 3),
                            "sentences_per_second": round(len(sources) / seconds, 2),
                            "bleu": round(sacrebleu.corpus_bleu(translations, [references]).score, 2),
                            "load_average": round(os.getloadavg()[0], 2), "model": str(folder),
                        }
                        reference = report["generate_translations"].get(generate_key)
                        if reference is not None:
                            row["identical_to_generate"] = round(
                                sum(a == b for a, b in zip(translations, reference, strict=True)) / len(sources), 4)
                        generate_row = next((r for r in report["rows"] if r["engine"] == "pytorch" and (
                            r["encoder_type"], r["beams"], r["batch_size"], r["threads"]) == key[:1] + key[2:]), None)
                        if generate_row is not None:
                            row["speedup_over_generate"] = round(generate_row["seconds"] / seconds, 2)
                        report["rows"].append(row)
                        done.add(key)
                        write(report, output)
                        log(f"{encoder_type} {engine} beams={beams} batch={batch_size} threads={cores}: "
                            f"{row['sentences_per_second']} sent/s, x{row.get('speedup_over_generate')}")
    print(markdown(report))


if __name__ == "__main__":
    main()
