#!/usr/bin/env python
"""Where a serving batch's time goes: for PyTorch `generate` and the ONNX Runtime model of one saved folder, the
seconds spent in the model's forward passes (PyTorch: the model's `forward`; ONNX Runtime: the sessions' `run`)
against the whole `generate` call, at beam 4 and greedy, one processor batch, one thread. The rest is `generate`'s
own work (beam search, logits processing, cache reordering), which both engines share: it bounds the speed-up that a
faster forward pass can give.

    python scripts/profile_serving.py --model runs/serve/transformer \\
        --onnx runs/serving-trained/transformer-transformer-ort-fp32 --output benchmarks/serving-profile-cpu.json
"""

import argparse
import functools
import json
import time
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"


class Timer:
    """Accumulates the seconds of the wrapped calls."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, function):
        @functools.wraps(function)  # the signature `generate` checks its keyword arguments against
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def main() -> None:
    from transformers import AutoModelForSeq2SeqLM

    from mgsa_hf.export.onnx_generation import OrtMgsaForConditionalGeneration
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the saved model folder")
    parser.add_argument("--onnx", required=True, help="its `mgsa-hf export onnx` folder")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", help="a JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    processor = MgsaProcessor.from_pretrained(args.model)
    sources = list(read_lines(DATA / "test_2016_flickr.en.gz", args.sentences))
    batches = [processor(sources[i: i + args.batch_size], return_tensors="pt")
               for i in range(0, len(sources), args.batch_size)]
    pytorch = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    ort = OrtMgsaForConditionalGeneration.from_pretrained(args.onnx, threads=1)
    timers = {"pytorch": Timer(), "onnxruntime": Timer()}
    pytorch.forward = timers["pytorch"].wrap(pytorch.forward)
    pytorch.get_encoder().forward = timers["pytorch"].wrap(pytorch.get_encoder().forward)
    for session in ort.sessions.values():
        session.run = timers["onnxruntime"].wrap(session.run)
    results = []
    for beams in (4, 1):
        for name, model in (("pytorch", pytorch), ("onnxruntime", ort)):
            with torch.inference_mode():
                model.generate(**batches[0], num_beams=beams, max_new_tokens=args.max_new_tokens)  # warm-up
                timers[name].seconds = 0.0
                start = time.perf_counter()
                for batch in batches:
                    model.generate(**batch, num_beams=beams, max_new_tokens=args.max_new_tokens)
                total = time.perf_counter() - start
            results.append({"engine": name, "beams": beams, "seconds": round(total, 3),
                            "forward_seconds": round(timers[name].seconds, 3),
                            "generate_own_seconds": round(total - timers[name].seconds, 3)})
            print(results[-1], flush=True)
    if args.output:
        from mgsa_hf.benchmarking.rows import portable_path

        settings = {key: portable_path(value) if isinstance(value, str) else value
                    for key, value in vars(args).items()}
        Path(args.output).write_text(json.dumps({"command": settings, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
