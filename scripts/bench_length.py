#!/usr/bin/env python
"""How each variant's training step grows with sentence length, as a ratio to the plain Transformer at each length.

Sentences of exactly 16 ... 256 source and target tokens are cut from joined consecutive Multi30k captions and run
through `MgsaProcessor` (spaCy parse included, so every syntax field is real); each batch holds the same number of
source tokens (`--tokens`), so a flat line means cost linear in length. Step = forward + backward + AdamW step,
median of `--steps` after `--warmup`, the variants interleaved step by step (`bench_speed.time_training`).

    python scripts/bench_length.py --threads 1        # writes benchmarks/length-cpu.json and length-cpu.png
    python scripts/bench_length.py --save-inputs gpu-data/length-inputs.pt   # parse here ...
    python scripts/bench_length.py --inputs gpu-data/length-inputs.pt --device cuda --dtype bf16   # ... time there
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_speed import (
    DEFAULT_DATA,
    REPO,
    SIZES,
    VARIANTS,
    build_model,
    build_processor,
    read_sentences,
    select_device,
    time_training,
)


LENGTH_VARIANTS = [
    "transformer", "phrase_memory", "phrase_memory (syntactic, SANs, ON-LSTM)", "phrase_representation",
    "hybrid", "rhe",
]


def log(message: str) -> None:
    print(f"[bench_length {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def joined_texts(sentences: list[str], count: int, words: int) -> list[str]:
    """`count` texts of `words` words each, cut from the captions joined end to end."""
    pool = " ".join(sentences).split()
    if len(pool) < count * words:
        raise SystemExit(f"{len(pool)} words of data are too few for {count} texts of {words} words")
    return [" ".join(pool[i * words : (i + 1) * words]) for i in range(count)]


def build_inputs(args) -> dict:
    """Per length, one batch of `tokens // length` sentences of exactly `length` tokens on both sides (texts of
    more words than tokens, truncated by the processor)."""
    data = Path(args.data)
    with tempfile.TemporaryDirectory() as folder:
        processor = build_processor(Path(folder), data)
    total_words = 2 * args.tokens  # a word is at least one token: twice the tokens in words is always enough
    sources = read_sentences(data, "train", "en", total_words // 5)
    targets = read_sentences(data, "train", "de", total_words // 5)
    batches = {}
    for length in args.lengths:
        count = max(1, args.tokens // length)
        source, target = joined_texts(sources, count, length), joined_texts(targets, count, length)
        batch = processor(source, text_target=target, max_length=length, truncation=True, padding="max_length",
                          return_tensors="pt")
        if not bool(batch["attention_mask"].all()):
            raise SystemExit(f"a text of {length} words gave fewer than {length} tokens")
        batches[length] = dict(batch)
        log(f"length {length}: {count} sentences, parsed")
    tokenizer = processor.tokenizer
    vocab = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
             "eos_token_id": tokenizer.eos_token_id}
    return {"vocab": vocab, "batches": batches}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (absolute, ratio) = plt.subplots(1, 2, figsize=(11, 4))
    lengths = [int(length) for length in result["lengths"]]
    for name in result["variants"]:
        rows = [result["lengths"][str(length)][name] for length in lengths]
        absolute.plot(lengths, [row["train_step_s"] * 1e3 / result["tokens"] * 1e3 for row in rows], marker="o",
                      label=name)
        ratio.plot(lengths, [row["train_step_ratio"] for row in rows], marker="o", label=name)
    absolute.set(xscale="log", xlabel="sentence length (tokens)", ylabel="ms per 1000 source tokens",
                 title="training step per token")
    ratio.set(xscale="log", xlabel="sentence length (tokens)", ylabel="step time / transformer",
              title="ratio to the transformer")
    for axis in (absolute, ratio):
        axis.minorticks_off()
        axis.set_xticks(lengths, [str(length) for length in lengths])
        axis.grid(alpha=0.3)
    ratio.legend(fontsize=7)
    figure.suptitle(f"{result['size']}, {result['device']}, {result['threads']} thread(s), "
                    f"{result['tokens']} source tokens per batch")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def add_batch_arguments(parser: argparse.ArgumentParser, tokens: int) -> None:
    """The options of the exact-length batches ([`build_inputs`]) and of where they are timed, shared with
    `bench_layer.py`; `tokens` is the default number of source tokens per batch."""
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Multi30k folder ({split}.{lang}.gz)")
    parser.add_argument("--inputs", metavar="FILE",
                        help="batches saved by `bench_length.py --save-inputs` (no spaCy needed)")
    parser.add_argument("--size", default="base", choices=list(SIZES["marian"]), help="Marian size")
    parser.add_argument("--lengths", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    parser.add_argument("--tokens", type=int, default=tokens, help="source tokens per batch at every length")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser, tokens=2048)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    parser.add_argument("--save-inputs", metavar="FILE", help="parse and save the batches, then stop")
    parser.add_argument("--variants", nargs="*", default=LENGTH_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--output", help="results JSON (default: benchmarks/length-<device>.json, a plot beside it)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.inputs:
        inputs = torch.load(args.inputs)
    else:
        inputs = build_inputs(args)
        if args.save_inputs:
            Path(args.save_inputs).parent.mkdir(parents=True, exist_ok=True)
            torch.save(inputs, args.save_inputs)
            log(f"saved {args.save_inputs}")
            return
    device = select_device(args.device)
    models = {name: build_model(inputs["vocab"], "marian", args.size, VARIANTS[name], device)
              for name in args.variants}
    lengths = {}
    for length, batch in inputs["batches"].items():
        log(f"length {length}: timing")
        seconds = time_training(models, [batch], args.steps, args.warmup, device, args.dtype == "bf16")
        reference = seconds[args.variants[0]]
        lengths[str(length)] = {name: {"train_step_s": value, "train_step_ratio": value / reference}
                                for name, value in seconds.items()}
        log("  " + ", ".join(f"{name} {row['train_step_ratio']:.3f}" for name, row in lengths[str(length)].items()))
    result = {
        "command": "python scripts/bench_length.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "size": f"marian {args.size}", "config": SIZES["marian"][args.size], "tokens": args.tokens,
        "device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "machine": platform.platform(), "torch": torch.__version__, "variants": args.variants, "lengths": lengths,
    }
    out = Path(args.output) if args.output else REPO / "benchmarks" / f"length-{args.device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
