#!/usr/bin/env python
"""CPU translation speed and quality of a plain-Transformer MGSA model in Transformers and in CTranslate2.

Both engines translate the same test set in the same run, with the same thread count, beam size, batch size and
length limit, each after a warm-up batch; `--repeats` alternates them and keeps each engine's fastest pass. Reported
per engine: seconds, sentences per second, sacreBLEU BLEU and chrF against the references, distinct translations, and
for CTranslate2 the share of translations identical to Transformers'. The load average is recorded before and after,
since other processes slow both engines alike but make the absolute numbers noisy.

    python scripts/bench_ctranslate2.py runs/mgsa-multi30k --threads 1    # writes benchmarks/ctranslate2-cpu.json
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from mgsa_hf import MgsaForConditionalGeneration
from mgsa_hf.benchmarking.rows import portable_path, recorded_command
from mgsa_hf.export import export_ctranslate2, translate_ctranslate2
from mgsa_hf.tokenization_utils import read_lines


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"


def log(message: str) -> None:
    print(f"[bench_ctranslate2 {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help='a saved encoder_type="transformer" folder, e.g. runs/mgsa-multi30k')
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--reference", default=str(DATA / "test_2016_flickr.de.gz"))
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="Transformers' limit; CTranslate2 gets one less, as Transformers forces EOS last")
    parser.add_argument("--threads", type=int, default=1, help="torch threads = CTranslate2 intra_threads")
    parser.add_argument("--quantizations", nargs="+", default=["float32", "int8"],
                        help="CTranslate2 weight types to time (float32 computes what Transformers computes)")
    parser.add_argument("--repeats", type=int, default=2, help="passes per engine, alternating; the fastest counts")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "ctranslate2-cpu.json"))
    return parser.parse_args(argv)


def translate_transformers(model, tokenizer, sources, args) -> list[str]:
    translations = []
    for start in range(0, len(sources), args.batch_size):
        batch = tokenizer(sources[start : start + args.batch_size], return_tensors="pt", padding=True)
        with torch.inference_mode():
            output = model.generate(**batch, num_beams=args.beams, max_new_tokens=args.max_new_tokens,
                                    do_sample=False)
        translations += tokenizer.batch_decode(output, skip_special_tokens=True)
    return translations


def scores(translations: list[str], references: list[str]) -> dict:
    import sacrebleu

    return {
        "bleu": round(sacrebleu.corpus_bleu(translations, [references]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(translations, [references]).score, 2),
        "distinct": len(set(translations)),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    import ctranslate2

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    sources, references = list(read_lines(args.source)), list(read_lines(args.reference))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = MgsaForConditionalGeneration.from_pretrained(args.model).eval()
    engines = {"transformers": lambda texts: translate_transformers(model, tokenizer, texts, args)}
    with tempfile.TemporaryDirectory() as folder:
        for quantization in args.quantizations:
            path = export_ctranslate2(args.model, Path(folder) / quantization, quantization=quantization)
            translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=args.threads, inter_threads=1)
            engines[f"ctranslate2-{quantization}"] = (
                lambda texts, translator=translator: translate_ctranslate2(
                    translator, tokenizer, texts, beam_size=args.beams, max_batch_size=args.batch_size,
                    max_decoding_length=args.max_new_tokens - 1,
                )
            )
        seconds = {name: [] for name in engines}
        outputs = {}
        for translate in engines.values():
            translate(sources[: args.batch_size])  # warm-up
        for repeat in range(args.repeats):
            for name, translate in engines.items():
                start = time.perf_counter()
                outputs[name] = translate(sources)
                seconds[name].append(time.perf_counter() - start)
                log(f"pass {repeat + 1}: {name} {seconds[name][-1]:.1f} s")
    load_after = os.getloadavg()

    reference_outputs = outputs["transformers"]
    results = {}
    for name, translations in outputs.items():
        best = min(seconds[name])
        results[name] = {
            "seconds": round(best, 2),
            "seconds_per_pass": [round(value, 2) for value in seconds[name]],
            "sentences_per_second": round(len(sources) / best, 1),
            "speedup_over_transformers": round(min(seconds["transformers"]) / best, 2),
            **scores(translations, references),
            "identical_to_transformers": round(
                sum(a == b for a, b in zip(translations, reference_outputs, strict=True)) / len(sources), 4
            ),
        }
    report = {
        "command": recorded_command(os.path.relpath(__file__, REPO), sys.argv[1:]),
        "model": portable_path(args.model),
        "source": os.path.relpath(args.source, REPO.parent),
        "sentences": len(sources),
        "beams": args.beams,
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "repeats": args.repeats,
        "other_processes_running": load_before[0] > args.threads + 0.5,
        "load_note": (
            f"1-minute load average {load_before[0]:.2f} before and {load_after[0]:.2f} after the run on "
            f"{os.cpu_count()} cores, {args.threads} thread(s) of it this benchmark's: "
            + ("other processes were running, so the times are slower and noisier than alone; re-run the command "
               "on an idle machine for clean absolute numbers." if load_before[0] > args.threads + 0.5
               else "the machine was otherwise idle.")
        ),
        "load_average_before": [round(value, 2) for value in load_before],
        "load_average_after": [round(value, 2) for value in load_after],
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "results": results,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
