#!/usr/bin/env python
"""How fast any fp32 engine could serve a model on this CPU: the floating-point work of one `generate` call against
the fastest matrix product the machine runs.

For each saved model folder: one processor batch of test 2016 sentences, `generate` at `--beams`, exactly
`--new-tokens` new tokens a sentence. `torch.utils.flop_counter.FlopCounterMode` counts the call's floating-point
operations (matrix products and attention); the call is then timed (best of `--repeats`, after a warm-up) on one and
on two threads, with the seconds inside the model's forward passes apart from `generate`'s own work. The machine's
fastest fp32 matrix product is measured at the same thread counts: PyTorch's (`torch.mm`) and ONNX Runtime's
(`MatMul`, MLAS), at the output projection's shape (the batch's rows × `d_model` × vocabulary) and at 2048³; the
best of all is the machine's rate.

`bound` = `generate`'s seconds / (FLOPs / the machine's rate): the largest speed-up over `generate` that an engine
computing the same FLOPs in fp32 could reach if every FLOP ran at that rate and nothing else took any time.
`search_bound` = `generate`'s seconds / its forward passes' seconds: the most that taking the search's own work out of
Python can give with PyTorch's kernels. A speed-up goal above `bound` cannot be met at fp32 on this CPU, whatever
runs the search and whatever the kernels.
`--reuse-freed-cpu-memory` measures `generate` with glibc keeping what the process frees, as `mgsa-hf translate` and
`mgsa-hf evaluate` run on CPU (a setting of the whole process: one run with it, one without).

    python scripts/serving_bound.py --model transformer=runs/serving-base/fresh-marian-base-32000-transformer ... \\
        --output benchmarks/serving-bound-cpu-base.json
"""

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TYPE=FOLDER")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reuse-freed-cpu-memory", action="store_true",
                        help="glibc keeps what the process frees (`mgsa_hf.training.cpu_memory`), as `mgsa-hf "
                             "translate` and `evaluate` do on CPU")
    parser.add_argument("--output", required=True, help="a JSON file; a markdown table is written beside it")
    return parser.parse_args(argv)


def best_seconds(function, repeats: int) -> float:
    """The fastest of `repeats` calls of `function`, after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rates(shapes: list[tuple[int, int, int]], threads: int) -> dict:
    """FLOP/s of fp32 `(m, k) @ (k, n)` for each shape, by PyTorch (`torch.mm`) and ONNX Runtime (`MatMul`), into an
    output allocated once (a fresh one each call would time the allocator's page faults too)."""
    import onnxruntime
    from onnx import TensorProto, helper

    torch.set_num_threads(threads)
    rates = {}
    for m, k, n in shapes:
        flops = 2 * m * k * n
        left, right, product = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        rates[f"torch {m}x{k}x{n}"] = flops / best_seconds(functools.partial(torch.mm, left, right, out=product), 20)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
             helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = onnxruntime.InferenceSession(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        binding.bind_cpu_input("a", left.numpy())
        binding.bind_cpu_input("b", right.numpy())
        binding.bind_output("c", "cpu", 0, np.float32, [m, n], product.data_ptr())
        rates[f"onnxruntime {m}x{k}x{n}"] = flops / best_seconds(
            functools.partial(session.run_with_iobinding, binding), 20)
    return {name: round(rate / 1e9, 1) for name, rate in rates.items()}


def markdown(report: dict) -> str:
    lines = ["| type | GFLOP a batch | threads | `generate` s | forward passes s | search bound | machine GFLOP/s "
             "| at that rate s | FLOP bound |", "|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        lines.append(f"| {row['encoder_type']} | {row['gflop']} | {row['threads']} | {row['generate_seconds']} | "
                     f"{row['forward_seconds']} | {row['search_bound']}× | {row['machine_gflops']} | "
                     f"{row['seconds_at_machine_rate']} | {row['bound']}× |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSeq2SeqLM

    from mgsa_hf.benchmarking.rows import cpu_description, portable_path, recorded_command
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import read_lines

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_serving import Timer

    args = parse_args(argv)
    if args.reuse_freed_cpu_memory:
        from mgsa_hf.training.cpu_memory import reuse_freed_cpu_memory

        reuse_freed_cpu_memory()
    torch.set_grad_enabled(False)
    sources = list(read_lines(DATA / "test_2016_flickr.en.gz", args.batch_size))
    report = {"command": recorded_command(os.path.relpath(__file__, REPO), sys.argv[1:] if argv is None else argv),
              "machine": platform.platform(), "cpu": cpu_description(), "cpu_count": os.cpu_count(),
              "torch": torch.__version__,
              "batch_size": args.batch_size, "beams": args.beams, "new_tokens": args.new_tokens,
              "reuse_freed_cpu_memory": args.reuse_freed_cpu_memory, "rates": {},
              "rows": []}
    output = Path(args.output)
    for item in args.model:
        encoder_type, folder = item.split("=", 1)
        processor = MgsaProcessor.from_pretrained(folder)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        batch = processor(sources, return_tensors="pt")
        rows = args.batch_size * args.beams
        if not report["rates"]:  # the output projection's shape: every beam's row × d_model × vocabulary
            shapes = [(rows, model.config.d_model, model.config.vocab_size), (2048, 2048, 2048)]
            report["rates"] = {threads: matmul_rates(shapes, threads) for threads in args.threads}
        timer = Timer()
        model.forward = timer.wrap(model.forward)
        model.get_encoder().forward = timer.wrap(model.get_encoder().forward)

        translate = functools.partial(model.generate, **batch, num_beams=args.beams, do_sample=False,
                                      max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)

        torch.set_num_threads(1)
        with FlopCounterMode(display=False) as counter:
            translate()
        flops = counter.get_total_flops()
        for threads in args.threads:
            torch.set_num_threads(threads)
            translate()  # warm-up
            best = None
            for _ in range(args.repeats):
                timer.seconds, start = 0.0, time.perf_counter()
                translate()
                seconds = time.perf_counter() - start
                if best is None or seconds < best[0]:
                    best = (seconds, timer.seconds)
            rate = max(report["rates"][threads].values()) * 1e9
            report["rows"].append({
                "encoder_type": encoder_type, "model": portable_path(folder), "threads": threads,
                "flops": flops, "gflop": round(flops / 1e9, 1), "generate_seconds": round(best[0], 3),
                "forward_seconds": round(best[1], 3), "achieved_gflops": round(flops / best[0] / 1e9, 1),
                "machine_gflops": round(rate / 1e9, 1), "seconds_at_machine_rate": round(flops / rate, 3),
                "bound": round(best[0] * rate / flops, 2), "search_bound": round(best[0] / best[1], 2),
                "load_average": round(os.getloadavg()[0], 2),
            })
            print(report["rows"][-1], flush=True)
            output.write_text(json.dumps(report, indent=2) + "\n")
            output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
