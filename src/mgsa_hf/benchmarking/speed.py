"""Speed and memory of every encoder variant as ratios to the plain Transformer, measured in the same run.

For each backbone (Marian, T5) and model size, the same real Multi30k batches (through `MgsaProcessor`, parser
included) feed every variant:

* training step time: forward + backward + AdamW step, median over `--steps` steps after `--warmup`, the variants
  interleaved step by step so that machine noise hits them alike;
* generation throughput: beam search (4 beams) over `--gen-sentences` sentences, sentences/s, every variant forced
  to the same output length (random weights would otherwise stop at different lengths);
* peak memory of a training step on 128-token sentences: `torch.cuda.max_memory_allocated` on GPU; on CPU each
  variant runs in `--memory-repeats` fresh subprocesses, each measuring the peak resident set growth over the step,
  and the median counts.

    python scripts/bench_speed.py --backbones marian --sizes base   # writes benchmarks/speed-cpu-marian-base.json
    python scripts/bench_speed.py --backbones t5 --sizes base   # the T5 family alone (speed-cpu-t5-base.json)
    # on a GPU machine without spaCy: build the batches here, carry the file, time there
    python scripts/bench_speed.py --save-inputs gpu-data/speed-inputs.pt --sizes base big
    python scripts/bench_speed.py --inputs gpu-data/speed-inputs.pt --device cuda --dtype bf16 --sizes base big

Ratios are variant / transformer: > 1 means slower (or more memory).
"""

import argparse
import gzip
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from ..training.catalogue import default_data
from .rows import REPOSITORY, SPEED_ROWS, package_environment, recorded_command, rows_named


# $MGSA_HF_DATA/multi30k, else ../shared/data/multi30k beside the checkout
DEFAULT_DATA = Path(default_data(REPOSITORY))

# backbone -> size -> configuration fields (the same sizes in each backbone's own names)
SIZES = {
    "marian": {
        "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                     decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
        "small": dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024),
        "big": dict(d_model=1024, encoder_layers=6, decoder_layers=6, encoder_attention_heads=16,
                    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096),
    },
    "t5": {
        "base": dict(d_model=512, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64, d_ff=2048),
        "small": dict(d_model=256, num_layers=3, num_decoder_layers=3, num_heads=4, d_kv=64, d_ff=1024),
        "big": dict(d_model=1024, num_layers=6, num_decoder_layers=6, num_heads=16, d_kv=64, d_ff=4096),
    },
}

# row name -> MgsaConfig fields (`benchmarking.rows`, read from configs/); the first entry is the reference
VARIANTS = rows_named(SPEED_ROWS)

# the limits a variant family is held to: (train step, generation, memory) as ratios to the transformer
TARGETS = {
    "phrase_memory": (1.05, 1.05, 1.10),
    "phrase_representation": (1.50, 1.35, 1.50),
    "hybrid": (1.05, 1.05, 1.10),
    "rhe": (1.05, 1.05, 1.10),
}


def log(message: str) -> None:
    """Print `message` to stderr with the time."""
    print(f"[bench_speed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_sentences(data: Path, split: str, lang: str, limit: int) -> list[str]:
    """The first `limit` lines of the corpus file `<data>/<split>.<lang>.gz`, stripped."""
    with gzip.open(data / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        return [line.strip() for _, line in zip(range(limit), handle, strict=False)]


def build_processor(workdir: Path, data: Path, vocab_size: int = 8000):
    """An `MgsaProcessor` with a joint `vocab_size`-token tokenizer trained on the corpus's train split (under
    `workdir`)."""
    from .. import MgsaProcessor
    from ..tokenization_utils import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(
        [data / "train.en.gz"], [data / "train.de.gz"], vocab_size=vocab_size, output_dir=workdir / "tokenizer"
    )
    return MgsaProcessor(tokenizer=tokenizer)


def make_batches(processor, sources, targets, batch_size: int) -> list[dict]:
    """The processor's batches (tokens, syntax fields, labels) of `batch_size` sentence pairs each."""
    return [
        dict(processor(sources[i : i + batch_size], text_target=targets[i : i + batch_size], return_tensors="pt"))
        for i in range(0, len(sources), batch_size)
    ]


def long_sentences(sources: list[str], count: int, words: int = 100) -> list[str]:
    """Sentences of about 128 subword tokens, made by joining consecutive Multi30k captions."""
    joined, pool = [], " ".join(sources).split()
    for i in range(count):
        joined.append(" ".join(pool[i * words : (i + 1) * words]))
    return joined


def build_inputs(args) -> dict:
    """Every batch the benchmark feeds the models, made once with `MgsaProcessor` (spaCy parse included): the
    training batches, the generation batches and the 128-token memory batch, with the vocabulary's ids. Saved with
    `--save-inputs` and read with `--inputs`, so that a machine without spaCy can run the timings."""
    with tempfile.TemporaryDirectory() as folder:
        processor = build_processor(Path(folder), Path(args.data))
    sources = read_sentences(Path(args.data), "train", "en", args.batch_size * args.num_batches)
    targets = read_sentences(Path(args.data), "train", "de", args.batch_size * args.num_batches)
    long_source = long_sentences(sources, args.memory_batch_size)
    tokenizer = processor.tokenizer
    return {
        "vocab": {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                  "eos_token_id": tokenizer.eos_token_id},
        "train_batches": make_batches(processor, sources, targets, args.batch_size),
        "gen_batches": make_batches(processor, sources[: args.gen_sentences], targets[: args.gen_sentences], 16),
        "long_batch": dict(processor(long_source, text_target=targets[: len(long_source)], return_tensors="pt")),
    }


# exact-length batches (`scripts/bench_length.py`, `scripts/bench_layer.py`)


def joined_texts(sentences: list[str], count: int, words: int) -> list[str]:
    """`count` texts of `words` words each, cut from the captions joined end to end."""
    pool = " ".join(sentences).split()
    if len(pool) < count * words:
        raise SystemExit(f"{len(pool)} words of data are too few for {count} texts of {words} words")
    return [" ".join(pool[i * words : (i + 1) * words]) for i in range(count)]


def build_length_inputs(args) -> dict:
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


def add_batch_arguments(parser: argparse.ArgumentParser, tokens: int) -> None:
    """The options of the exact-length batches ([`build_length_inputs`]) and of where they are timed, of
    `scripts/bench_length.py` and `scripts/bench_layer.py`; `tokens` is the default source tokens per batch."""
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Multi30k folder ({split}.{lang}.gz)")
    parser.add_argument("--inputs", metavar="FILE",
                        help="batches saved by `bench_length.py --save-inputs` (no spaCy needed)")
    parser.add_argument("--size", default="base", choices=list(SIZES["marian"]), help="Marian size")
    parser.add_argument("--lengths", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    parser.add_argument("--tokens", type=int, default=tokens, help="source tokens per batch at every length")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def build_model(vocab: dict, backbone: str, size: str, fields: dict, device, dtype=torch.float32):
    """A fresh model of the family and size; `vocab` holds `vocab_size`, `pad_token_id` and `eos_token_id`."""
    from ..training.conversion import BACKBONES

    config_class, model_class = BACKBONES[backbone]
    extra = dict(max_position_embeddings=512, dropout=0.1) if backbone == "marian" else dict(dropout_rate=0.1)
    config = config_class(
        vocab_size=vocab["vocab_size"], pad_token_id=vocab["pad_token_id"],
        decoder_start_token_id=vocab["pad_token_id"], eos_token_id=vocab["eos_token_id"],
        forced_eos_token_id=vocab["eos_token_id"], **extra, **SIZES[backbone][size], **fields,
    )
    torch.manual_seed(0)
    return model_class(config).to(device=device, dtype=dtype)


def to_device(batch: dict, device) -> dict:
    """Every tensor of `batch` moved to `device`."""
    return {key: value.to(device) for key, value in batch.items()}


def select_device(name: str) -> torch.device:
    """The `--device` to time on; `cuda` where torch sees no GPU is refused with a clear message."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here.")
    return device


def synchronize(device) -> None:
    """Wait for the device's queued kernels (CUDA), so that a timer reads them."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def autocast(device, amp: bool):
    """bf16 autocast (weights and optimizer in fp32, as in mixed-precision training) or nothing."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp)


def train_step(model, optimizer, batch, amp: bool = False) -> None:
    """One timed training step: forward (under bf16 autocast with `amp`), backward, optimizer step."""
    with autocast(model.device, amp):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_training(models: dict, batches: list[dict], steps: int, warmup: int, device, amp: bool = False
                  ) -> dict[str, float]:
    """Median seconds per training step of each model, the models interleaved step by step."""
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    times = {name: [] for name in models}
    for step in range(warmup + steps):
        batch = to_device(batches[step % len(batches)], device)
        for name, model in models.items():
            model.train()
            synchronize(device)
            start = time.perf_counter()
            train_step(model, optimizers[name], batch, amp)
            synchronize(device)
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def time_generation(models: dict, batches: list[dict], new_tokens: int, rounds: int, device, amp: bool = False
                    ) -> dict[str, float]:
    """Sentences per second with 4-beam search, every model producing exactly `new_tokens` tokens."""
    sentences = sum(len(batch["input_ids"]) for batch in batches)
    seconds = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            model.eval()
            synchronize(device)
            start = time.perf_counter()
            with torch.no_grad(), autocast(device, amp):
                for batch in batches:
                    inputs = {k: v for k, v in to_device(batch, device).items() if k not in ("labels",)}
                    model.generate(**inputs, num_beams=4, min_new_tokens=new_tokens, max_new_tokens=new_tokens)
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {name: sentences / statistics.median(values) for name, values in seconds.items()}


def peak_memory_cuda(model, batch, device, amp: bool = False) -> float:
    """Peak allocation growth (MiB) over one training step, after a first step on one sentence has allocated the
    gradients and the optimizer state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = to_device(batch, device)
    train_step(model, optimizer, {key: value[:1] for key, value in batch.items()}, amp)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train_step(model, optimizer, batch, amp)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def load_inputs(path, vocab_size: int | None = None) -> dict:
    """Batches saved by `--save-inputs`, with the models' vocabulary widened to `vocab_size` when given."""
    inputs = torch.load(path, weights_only=True)
    return with_vocab_size(inputs, vocab_size)


def with_vocab_size(inputs: dict, vocab_size: int | None) -> dict:
    """`inputs` with the models' vocabulary widened to `vocab_size` (not below the tokenizer's); None keeps it."""
    if vocab_size is not None:
        if vocab_size < inputs["vocab"]["vocab_size"]:
            raise SystemExit(f"--vocab-size {vocab_size} is below the tokenizer's {inputs['vocab']['vocab_size']}")
        inputs["vocab"] = dict(inputs["vocab"], vocab_size=vocab_size)
    return inputs


def peak_memory_cpu_child(args) -> None:
    """Runs in a subprocess: the peak resident-set growth (MiB) over one training step, printed as JSON — the CPU
    counterpart of `peak_memory_cuda`."""
    inputs = load_inputs(args.memory_batch, args.vocab_size)
    batch = inputs["long_batch"]
    fields = json.loads(args.memory_fields)
    model = build_model(inputs["vocab"], args.memory_backbone, args.memory_size, fields, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # a first step on one sentence loads the kernels and allocates the optimizer state, which the peak should not
    # count; then the peak resident set over a full step, from the resident set before it. The peak is the kernel's
    # high-water mark VmHWM, reset before the step (`clear_refs` 5): `ru_maxrss` would start from the parent's
    # resident set, which it keeps across fork and exec.
    train_step(model, optimizer, {key: value[:1] for key, value in batch.items()})
    Path("/proc/self/clear_refs").write_text("5")
    rss_kib = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() // 1024
    train_step(model, optimizer, batch)
    status = Path("/proc/self/status").read_text()
    peak_kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    print(json.dumps({"peak_mib": (peak_kib - rss_kib) / 1024}))


def peak_memory_cpu(
    inputs_path: Path, backbone: str, size: str, fields: dict, repeats: int, vocab_size: int | None = None
) -> list[float]:
    """`peak_memory_cpu_child`'s figure in each of `repeats` fresh processes (the caller takes the median): the
    resident-set peak of one process varies by tens of MiB with the allocator's timing (the same variant measured
    561-605 MiB)."""
    command = [sys.executable, "-m", "mgsa_hf.benchmarking.speed", "--memory-child", "--memory-batch",
               str(inputs_path), "--memory-backbone", backbone, "--memory-size", size, "--memory-fields",
               json.dumps(fields), "--threads", str(torch.get_num_threads())]
    if vocab_size is not None:
        command += ["--vocab-size", str(vocab_size)]
    peaks = []
    for _ in range(repeats):
        result = subprocess.run(command, capture_output=True, text=True, check=True, env=package_environment())
        peaks.append(json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"])
    return peaks


def benchmark_size(args, inputs: dict, inputs_path: Path, backbone: str, size: str, device) -> dict:
    """The result of one backbone and size: each variant's parameters, timings and memory, and the requested checks."""
    train_batches, long_batch = inputs["train_batches"], inputs["long_batch"]
    amp = args.dtype == "bf16"
    models = {
        name: build_model(inputs["vocab"], backbone, size, fields, device) for name, fields in args.variants.items()
    }
    label = f"{backbone} {size}"
    timings = None if args.checks_only else measure(args, models, inputs, inputs_path, backbone, size, device)
    kernels = None
    if args.kernel_check and size == args.sizes[0]:
        log(f"{label}: attention kernels")
        kernels = {name: kernel_check(model, train_batches[0], device, amp) for name, model in models.items()}
        reference = next(iter(kernels))
        for entry in kernels.values():
            entry["kernels_ratio"] = entry["kernels_per_step"] / kernels[reference]["kernels_per_step"]
    compiled = None
    if args.compile_check and size == args.sizes[0]:
        log(f"{label}: torch.compile")
        compiled = compile_check(models, train_batches[0], device, amp, args.compile_steps)
    rows = {}
    for name, model in models.items():
        rows[name] = {
            "parameters": model.num_parameters(),
            **(timings[name] if timings else {}),
            "attn_implementation": model.config._attn_implementation,
            **(kernels[name] if kernels else {}),
            **({"compile": compiled[name]} if compiled else {}),
        }
    return {
        "size": label,
        "config": SIZES[backbone][size],
        "vocab_size": inputs["vocab"]["vocab_size"],
        "batch": {"sentences": len(train_batches[0]["input_ids"]), "mean_source_tokens": float(
            sum(b["attention_mask"].sum() for b in train_batches) / sum(len(b["input_ids"]) for b in train_batches))},
        "long_batch_source_tokens": list(long_batch["input_ids"].shape),
        "variants": rows,
    }


def measure(args, models: dict, inputs: dict, inputs_path: Path, backbone: str, size: str, device) -> dict:
    """The training step, generation and peak memory of every variant, with their ratios to the first (the
    transformer)."""
    train_batches, gen_batches, long_batch = inputs["train_batches"], inputs["gen_batches"], inputs["long_batch"]
    amp = args.dtype == "bf16"
    label = f"{backbone} {size}"
    log(f"{label}: training steps")
    train = time_training(models, train_batches, args.steps, args.warmup, device, amp)
    log(f"{label}: generation")
    generation = time_generation(models, gen_batches, args.gen_tokens, args.gen_rounds, device, amp)
    log(f"{label}: peak memory")
    if device.type == "cuda":
        memory_runs = {name: [peak_memory_cuda(model, long_batch, device, amp)] for name, model in models.items()}
    else:
        memory_runs = {
            name: peak_memory_cpu(inputs_path, backbone, size, fields, args.memory_repeats, args.vocab_size)
            for name, fields in args.variants.items()
        }
    memory = {name: statistics.median(peaks) for name, peaks in memory_runs.items()}
    reference = next(iter(models))
    return {
        name: {
            "train_step_s": train[name],
            "train_step_ratio": train[name] / train[reference],
            "generation_sent_per_s": generation[name],
            "generation_ratio": generation[reference] / generation[name],
            "peak_memory_mib": memory[name],
            "peak_memory_ratio": memory[name] / memory[reference],
            "peak_memory_mib_runs": memory_runs[name],  # one per fresh process on CPU; the median counts
        }
        for name in models
    }


def compile_check(models: dict, batch: dict, device, amp: bool, steps: int) -> dict[str, dict]:
    """`torch.compile` on every variant: the graph breaks TorchDynamo finds in a training forward (with where they
    are), and the median compiled training step against the eager one on the same batch."""
    import torch._dynamo

    report = {}
    batch = to_device(batch, device)
    for name, model in models.items():
        model.train()
        torch._dynamo.reset()
        try:
            with autocast(device, amp):
                explained = torch._dynamo.explain(model)(**batch)
        except Exception as error:  # a variant that TorchDynamo cannot trace is reported, not fatal
            report[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            log(f"compile {name}: {report[name]}")
            continue
        reasons = []
        for reason in explained.break_reasons[:5]:
            frame = reason.user_stack[-1] if reason.user_stack else None
            where = f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"
            reasons.append(f"{where}: {str(reason.reason).splitlines()[0][:160]}")
        entry = {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
                 "break_reasons": reasons}
        if steps:
            torch._dynamo.reset()
            compiled = torch.compile(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            times = {}
            for label, module in (("eager", model), ("compiled", compiled)):
                values = []
                for _ in range(steps + 2):  # the first two compile (forward, backward) and warm up
                    synchronize(device)
                    start = time.perf_counter()
                    train_step(module, optimizer, batch, amp)
                    synchronize(device)
                    values.append(time.perf_counter() - start)
                times[label] = statistics.median(values[2:])
            entry.update(eager_step_s=times["eager"], compiled_step_s=times["compiled"],
                         speedup=times["eager"] / times["compiled"])
        report[name] = entry
        log(f"compile {name}: {entry}")
    torch._dynamo.reset()
    return report


def kernel_check(model, batch: dict, device, amp: bool) -> dict:
    """
    The kernels of a training step, counted as they are dispatched (on any device):

    * `attention_kernels`: which kernel computes each attention sub-layer of the forward. For every call of a module
      of the package's attention core ([`MgsaAttention`] and the variants' subclasses), the
      `scaled_dot_product_attention` (SDPA) implementations it ran, outside any nested attention module: on CUDA
      flash, efficient (memory-efficient), cudnn or math; on CPU flash_attention_for_cpu or math (SDPA's unfused
      fallback); or "explicit" where the module computes softmax(QKᵀ)V itself, without SDPA.
      `{"<module class>: <kernels>": number of calls}`.
    * `kernels_per_step`: the operators forward + backward dispatch that compute something (views, which launch
      nothing, left out): about one kernel launch each on a GPU, where a small step's time follows their number.
    """
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from ..modeling_attention import MgsaAttention

    sdpa_calls = []  # [kernel, claimed by an attention module], one per SDPA call
    computing_ops = [0]
    views = {"alias", "detach", "expand", "lift_fresh", "permute", "select", "slice", "split", "split_with_sizes",
             "squeeze", "t", "transpose", "unbind", "unsqueeze", "view", "_reshape_alias", "_unsafe_view"}

    class SdpaCalls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is nn.functional.scaled_dot_product_attention:
                sdpa_calls.append(["math", False])  # unless a fused kernel is dispatched below
            return func(*args, **(kwargs or {}))

    class DispatchedOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (func.is_view or func.overloadpacket.__name__ in views):
                computing_ops[0] += 1
            name = func._schema.name.removeprefix("aten::_scaled_dot_product_")
            if name != func._schema.name and not name.endswith("backward") and sdpa_calls:
                sdpa_calls[-1][0] = name.removesuffix("_attention")
            return func(*args, **(kwargs or {}))

    census, starts, handles = {}, [], []

    def before(module, args):
        starts.append(len(sdpa_calls))

    def after(module, args, output):
        kernels = set()
        for call in sdpa_calls[starts.pop():]:  # nested modules ended first and claimed theirs
            if not call[1]:
                kernels.add(f"sdpa {call[0]}")
                call[1] = True
        label = f"{type(module).__name__}: {' + '.join(sorted(kernels)) or 'explicit'}"
        census[label] = census.get(label, 0) + 1

    model.train()
    batch = to_device(batch, device)
    with autocast(device, amp):
        model(**batch).loss.backward()  # a first step: lazy initialisations dispatch once
    model.zero_grad(set_to_none=True)
    for module in model.modules():
        if isinstance(module, MgsaAttention):
            handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        with SdpaCalls(), DispatchedOps():
            with autocast(device, amp):
                loss = model(**batch).loss
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return {"attention_kernels": dict(sorted(census.items())), "kernels_per_step": computing_ops[0]}


def markdown_table(result: dict) -> str:
    """The markdown table of one size's result ([`benchmark_size`]), ratios marked against their `TARGETS`."""
    config = result["config"]
    layers = (config.get("encoder_layers", config.get("num_layers")), config.get("decoder_layers",
              config.get("num_decoder_layers")))
    heads = config.get("encoder_attention_heads", config.get("num_heads"))
    timed = {name: row for name, row in result["variants"].items() if "train_step_s" in row}  # none: --checks-only
    memory = f"; memory at {result['long_batch_source_tokens'][1]}-token sentences" if timed else ""
    lines = [
        f"**{result['size']}** ({config['d_model']}d, {layers[0]}+{layers[1]} layers, {heads} heads, "
        f"vocabulary {result.get('vocab_size', 8000)}; "
        f"{result['batch']['sentences']} sentences per batch, {result['batch']['mean_source_tokens']:.1f} source "
        f"tokens on average{memory})",
    ]
    if timed:
        lines += [
            "",
            "| variant | params | train step (s) | train ratio | gen sent/s | gen ratio | peak MiB | memory ratio |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    for name, row in timed.items():
        target = TARGETS.get(name.split("/")[0])  # a row is named by its encoder type (and config file)
        marks = [""] * 3
        if target:
            values = (row["train_step_ratio"], row["generation_ratio"], row["peak_memory_ratio"])
            marks = [
                " ✓" if value <= limit else f" ✗ (target ≤ {limit})"
                for value, limit in zip(values, target, strict=True)
            ]
        lines.append(
            f"| {name} | {row['parameters'] / 1e6:.1f}M | {row['train_step_s']:.3f} | "
            f"{row['train_step_ratio']:.3f}{marks[0]} | {row['generation_sent_per_s']:.1f} | "
            f"{row['generation_ratio']:.3f}{marks[1]} | {row['peak_memory_mib']:.0f} | "
            f"{row['peak_memory_ratio']:.3f}{marks[2]} |"
        )
    rows = result["variants"].values()
    if any("attention_kernels" in row or "compile" in row for row in rows):
        lines += ["", "Checks on a training step: the kernel of each attention sub-layer (calls), the kernels forward "
                  "and backward dispatch, and the graphs TorchDynamo traces (graph breaks):", "",
                  "| variant | attention kernels | kernels per fwd + bwd (ratio) | torch.compile graphs (breaks) |",
                  "| --- | --- | --- | --- |"]
        for name, row in result["variants"].items():
            kernels = ", ".join(f"{label} × {count}" for label, count in row.get("attention_kernels", {}).items())
            launches = f"{row['kernels_per_step']} ({row['kernels_ratio']:.3f})" if "kernels_per_step" in row else ""
            compiled = row.get("compile", {})
            graphs = f"{compiled['graphs']} ({compiled['graph_breaks']})" if "graphs" in compiled else (
                compiled.get("error", ""))
            lines.append(f"| {name} | {kernels} | {launches} | {graphs} |")
    return "\n".join(lines)


def default_output(args) -> Path:
    """`benchmarks/speed-<device>-<backbones>-<sizes>[-<vocabulary>k][-bf16].json`: what the run measures and where,
    e.g. `speed-cpu-marian-base.json`."""
    parts = ["speed", args.device, *args.backbones, *args.sizes]
    parts += [f"{round(args.vocab_size / 1000)}k"] if args.vocab_size else []
    parts += ["bf16"] if args.dtype == "bf16" else []
    return REPOSITORY / "benchmarks" / ("-".join(parts) + ".json")


def write_results(args, results: list[dict]) -> None:
    """Write results JSON (`--output`, or [`default_output`]) and its tables beside it; print them."""
    out = Path(args.output) if args.output else default_output(args)
    out.parent.mkdir(exist_ok=True)
    command = recorded_command("scripts/bench_speed.py", sys.argv[1:])
    import transformers

    payload = {"command": command, "device": args.device,
               "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
               "dtype": "bf16 autocast" if args.dtype == "bf16" else "fp32", "machine": platform.platform(),
               "torch": torch.__version__, "transformers": transformers.__version__,
               "threads": torch.get_num_threads(),
               "memory_repeats": args.memory_repeats if args.device == "cpu" else None, "results": results}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    tables = "\n\n".join(markdown_table(result) for result in results)
    print(tables)
    out.with_suffix(".md").write_text(f"Command: `{command}`\n\n{tables}\n")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of `scripts/bench_speed.py` (and of its memory probes)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: bfloat16 autocast over fp32 weights (mixed-precision training)")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Multi30k folder ({split}.{lang}.gz)")
    parser.add_argument("--save-inputs", metavar="FILE",
                        help="build the batches (spaCy parse included), save them to FILE and stop")
    parser.add_argument("--inputs", metavar="FILE",
                        help="read the batches from a --save-inputs file instead of parsing (no spaCy needed)")
    parser.add_argument("--backbones", nargs="*", default=list(SIZES), choices=list(SIZES),
                        help="model families, each measured against its own plain transformer")
    parser.add_argument("--sizes", nargs="*", default=["small", "base"], choices=list(SIZES["marian"]),
                        help="small (256d 3+3), base (512d 6+6, the papers' size), big (1024d 16 heads 6+6)")
    parser.add_argument("--output", help="results JSON (default: benchmarks/speed-<device>-<backbones>-<sizes>.json, "
                                         "e.g. speed-cpu-marian-base.json; a table beside it)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS),
                        help="rows: encoder types (their defaults) or <encoder_type>/<config file stem>")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gen-sentences", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=20)
    parser.add_argument("--gen-rounds", type=int, default=3)
    parser.add_argument("--memory-batch-size", type=int, default=16)
    parser.add_argument("--memory-repeats", type=int, default=3,
                        help="CPU: fresh processes per variant whose peak memory is measured; the median counts")
    parser.add_argument("--kernel-check", action="store_true",
                        help="at the first size: which kernel (SDPA flash / efficient / math, or explicit) computes "
                             "each attention sub-layer of a training forward, and how many kernels a step dispatches")
    parser.add_argument("--checks-only", action="store_true",
                        help="run only --kernel-check / --compile-check, without the timings and memory")
    parser.add_argument("--compile-check", action="store_true",
                        help="at the first size: graph breaks under torch.compile and the compiled step's speed-up")
    parser.add_argument("--compile-steps", type=int, default=10, help="timed compiled steps (0: graph breaks only)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--vocab-size", type=int,
                        help="the models' vocabulary (default: the 8k tokenizer's); a larger one widens only the "
                             "embeddings and the output layer, e.g. 32000 for the papers' WMT BPE vocabularies, while "
                             "the batches keep the tokenizer's ids")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory-batch", help=argparse.SUPPRESS)
    parser.add_argument("--memory-backbone", help=argparse.SUPPRESS)
    parser.add_argument("--memory-size", help=argparse.SUPPRESS)
    parser.add_argument("--memory-fields", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    others = [name for name in args.variants if name != "transformer"]
    try:
        args.variants = rows_named(["transformer", *others])
    except SystemExit as error:
        parser.error(f"{error}; the rows of the speed table are {list(VARIANTS)}")
    return args


def main(argv=None) -> None:
    """`scripts/bench_speed.py`: save the batches, run a memory probe, or time each variant, backbone and size."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        peak_memory_cpu_child(args)
        return
    if args.save_inputs:
        Path(args.save_inputs).parent.mkdir(parents=True, exist_ok=True)
        torch.save(build_inputs(args), args.save_inputs)
        log(f"inputs written to {args.save_inputs}")
        return
    device = select_device(args.device)
    with tempfile.TemporaryDirectory() as folder:
        if args.inputs:
            inputs, inputs_path = load_inputs(args.inputs, args.vocab_size), Path(args.inputs)
        else:  # the CPU memory probes (subprocesses) read the batches from a file
            inputs, inputs_path = build_inputs(args), Path(folder) / "inputs.pt"
            torch.save(inputs, inputs_path)
            with_vocab_size(inputs, args.vocab_size)
        results = []
        for backbone in args.backbones:
            for size in args.sizes:  # written after each size, so a long run keeps what it has measured
                results.append(benchmark_size(args, inputs, inputs_path, backbone, size, device))
                write_results(args, results)


if __name__ == "__main__":  # the memory probes of `peak_memory_cpu`
    main()
