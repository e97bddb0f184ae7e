"""The speed benchmarks (`mgsa_hf.benchmarking.speed`, `benchmarking.layers`) and their scripts on a machine without
spaCy (bench_speed.py, bench_length.py, bench_layer.py; profile_step.py and count_flops.py on the same batches): the
batches are built once with the processor (`--save-inputs`) and timed in a process where spaCy and `datasets` cannot
be imported (`--inputs`), as on a GPU machine; `--device cuda` is refused clearly where torch sees no GPU."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K

from mgsa_hf.benchmarking.layers import VariantAttention, profile
from mgsa_hf.benchmarking.rows import named_row
from mgsa_hf.benchmarking.speed import build_model


# the benchmark tools' own tests: not in the default run (setup.cfg), CI runs them with `-m benchmark_tools`
pytestmark = pytest.mark.benchmark_tools
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_speed.py"
SMALL = ["--batch-size", "4", "--num-batches", "1", "--gen-sentences", "4", "--memory-batch-size", "2",
         "--memory-repeats", "2"]


def run_script_without_spacy(script: str, *args: str) -> subprocess.CompletedProcess:
    """`scripts/<script>` with `args`, in a process where spaCy and `datasets` cannot be imported."""
    path = REPO / "scripts" / script
    code = (
        "import sys, runpy\n"
        "for name in ('spacy', 'datasets'): sys.modules[name] = None\n"
        f"sys.path.insert(0, {str(path.parent)!r})\n"
        f"sys.argv = [{script!r}, *{list(args)!r}]\n"
        f"runpy.run_path({str(path)!r}, run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def run_without_spacy(*args: str) -> subprocess.CompletedProcess:
    return run_script_without_spacy("bench_speed.py", *args)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    path = tmp_path_factory.mktemp("speed") / "inputs.pt"
    subprocess.run([sys.executable, str(SCRIPT), "--save-inputs", str(path), "--data", MULTI30K, *SMALL], check=True,
                   capture_output=True, text=True, timeout=600)
    return path


def test_saved_inputs_hold_every_syntax_field(inputs):
    saved = torch.load(inputs)
    assert saved["vocab"]["vocab_size"] > 1000
    for batch in (*saved["train_batches"], saved["long_batch"]):
        assert {"input_ids", "labels", "phrase_ids", "phrase_tags", "head_word_ids", "pr_phrase_ids",
                "local_phrase_start", "tree_depth"} <= set(batch)
    # the memory batch joins consecutive captions into long sentences
    assert saved["long_batch"]["input_ids"].shape[1] > max(b["input_ids"].shape[1] for b in saved["train_batches"])


def test_timings_from_saved_inputs_without_spacy(inputs, tmp_path):
    output = tmp_path / "speed.json"
    result = run_without_spacy("--inputs", str(inputs), "--device", "cpu", "--dtype", "bf16", "--threads", "1",
                               "--backbones", "marian", "--sizes", "small", "--variants", "transformer", "rhe",
                               "--steps", "1", "--warmup", "0", "--gen-rounds", "1", "--gen-tokens", "2",
                               "--kernel-check", "--vocab-size", "9000", "--output", str(output), *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["dtype"] == "bf16 autocast" and report["transformers"]
    assert report["results"][0]["vocab_size"] == 9000  # the models' vocabulary, wider than the tokenizer's
    rows = report["results"][0]["variants"]
    assert set(rows) == {"transformer", "rhe"} and rows["transformer"]["train_step_ratio"] == 1.0
    assert all(row["train_step_s"] > 0 and row["peak_memory_mib"] > 0 for row in rows.values())
    for row in rows.values():  # the median of the fresh processes' peaks, each kept
        assert row["peak_memory_mib"] == statistics.median(row["peak_memory_mib_runs"])
    assert output.with_suffix(".md").read_text().count("| rhe |") == 2  # speed table and checks table
    # the kernel of each attention sub-layer (small: 3 encoder self-, 3 decoder self- and 3 cross-attentions): SDPA
    # for the plain ones, RHE's bottom layer explicit (it reads its weights to identify heads)
    kernels = {name: row["attention_kernels"] for name, row in rows.items()}
    assert sum(kernels["transformer"].values()) == sum(kernels["rhe"].values()) == 9
    assert list(kernels["transformer"]) == ["MgsaAttention: sdpa flash_attention_for_cpu"]
    assert kernels["rhe"] == {"MgsaAttention: sdpa flash_attention_for_cpu": 8, "RheAttention: explicit": 1}
    # and the kernels a step dispatches: RHE's explicit attention and syntax bias add some to the same model
    assert rows["transformer"]["kernels_ratio"] == 1.0
    assert rows["rhe"]["kernels_per_step"] > rows["transformer"]["kernels_per_step"] > 100


def test_checks_only_without_spacy(inputs, tmp_path):
    """`--checks-only`: the kernel census and TorchDynamo's graphs, without timings, where spaCy is absent."""
    output = tmp_path / "checks.json"
    result = run_without_spacy("--inputs", str(inputs), "--device", "cpu", "--threads", "1", "--backbones", "marian",
                               "--sizes", "small", "--variants", "transformer", "phrase_representation",
                               "rhe/rhe_prune", "--checks-only", "--kernel-check", "--compile-check",
                               "--compile-steps", "0", "--output", str(output), *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(output.read_text())["results"][0]["variants"]
    assert list(rows) == ["transformer", "phrase_representation", "rhe/rhe_prune"]
    for row in rows.values():
        assert "train_step_s" not in row and row["attention_kernels"] and row["kernels_per_step"] > 0
        assert (row["compile"]["graphs"], row["compile"]["graph_breaks"]) == (1, 0), row["compile"]
    # PR adds a phrase attention to each of the 3 encoder and 3 decoder layers
    assert sum(rows["phrase_representation"]["attention_kernels"].values()) == 9 + 6
    table = output.with_suffix(".md").read_text()
    assert "train step" not in table and table.count("| rhe/rhe_prune |") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the refusal cannot be shown")
def test_cuda_without_a_gpu_is_refused_clearly(inputs):
    result = run_without_spacy("--inputs", str(inputs), "--device", "cuda", "--dtype", "bf16")
    assert result.returncode != 0 and "torch sees no CUDA device" in result.stderr


def test_profile_splits_a_step_into_its_parts(inputs):
    """scripts/profile_step.py on a PR model: every part of both sides is timed, they fit inside the forward pass."""
    saved = torch.load(inputs)
    model = build_model(saved["vocab"], "marian", "small", {"encoder_type": "phrase_representation"},
                        torch.device("cpu"))
    times = profile(model, saved["train_batches"], steps=1, warmup=0)
    for part in ("encoder.self_attn", "encoder.phrase_pooling", "encoder.phrase_combination", "encoder.fc1",
                 "decoder.encoder_attn", "decoder.phrase_combination", "decoder.transparent_attention"):
        assert times[part] > 0, part
    layer_parts = sum(value for key, value in times.items() if key.startswith(("encoder.", "decoder.")))
    assert layer_parts < times["total"] - times["backward"]
    assert times["forward: other (embeddings, output projection and loss, residuals, dropout)"] >= 0


@pytest.fixture(scope="module")
def length_inputs(tmp_path_factory):
    """scripts/bench_length.py's batches of 8 and 16 tokens (32 source tokens each), parsed with spaCy."""
    path = tmp_path_factory.mktemp("length") / "length.pt"
    subprocess.run([sys.executable, str(REPO / "scripts" / "bench_length.py"), "--save-inputs", str(path),
                    "--data", MULTI30K, "--lengths", "8", "16", "--tokens", "32"], check=True, capture_output=True,
                   text=True, timeout=600)
    return path


def test_length_scaling_batches_and_timings(length_inputs, tmp_path):
    """scripts/bench_length.py: exact-length batches of equal token count with every syntax field, parsed here and
    timed where spaCy cannot be imported; JSON and plot written."""
    saved = torch.load(length_inputs)
    for length, batch in saved["batches"].items():
        assert batch["input_ids"].shape == (32 // length, length) and bool(batch["attention_mask"].all())
        assert batch["labels"].shape == (32 // length, length)
        assert {"phrase_ids", "head_word_ids", "pr_phrase_ids", "local_phrase_start", "tree_depth"} <= set(batch)
    output = tmp_path / "length.json"
    result = run_script_without_spacy("bench_length.py", "--inputs", str(length_inputs), "--size", "small",
                                      "--threads", "1", "--variants", "transformer", "hybrid", "--steps", "1",
                                      "--warmup", "0", "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert set(report["lengths"]) == {"8", "16"}
    for rows in report["lengths"].values():
        assert rows["transformer"]["train_step_ratio"] == 1.0 and rows["hybrid"]["train_step_s"] > 0
    assert output.with_suffix(".png").stat().st_size > 0


def test_variant_attention_timings(length_inputs, tmp_path):
    """scripts/bench_layer.py where spaCy cannot be imported: each row's own self-attentions against the same ones of
    the plain model, RHE's share of important heads beside its rows (every head with a fixed gate of 0)."""
    output = tmp_path / "layer.json"
    result = run_script_without_spacy("bench_layer.py", "--inputs", str(length_inputs), "--size", "small",
                                      "--threads", "1", "--variants", "hybrid", "rhe/rhe_prune",
                                      "rhe (prune, every head important)", "--steps", "1", "--warmup", "0",
                                      "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["layers"] == {"hybrid": [0, 1], "rhe/rhe_prune": [0], "rhe (prune, every head important)": [0]}
    for rows in report["lengths"].values():
        assert all(row["variant_ms"] > 0 and row["transformer_ms"] > 0 for row in rows.values())
        assert "important_heads" not in rows["hybrid"]
        assert rows["rhe (prune, every head important)"]["important_heads"] == 1.0
    assert output.with_suffix(".md").read_text().count("| rhe/rhe_prune | 0 |") == 1


@pytest.mark.parametrize("row", ["phrase_memory", "hybrid", "rhe"])
def test_variant_attention_computes_what_the_model_computes(length_inputs, row):
    """What bench_layer.py times (the syntax preparation and the variant's self-attentions, from captured inputs) gives
    the outputs those self-attentions give inside a whole forward pass."""
    saved = torch.load(length_inputs)
    batch = saved["batches"][16]
    model = build_model(saved["vocab"], "marian", "small", named_row(row), torch.device("cpu")).eval()
    recorded = {}

    def record(module, args, output):
        recorded[module.layer_idx] = output[0]

    handles = [model.get_encoder().layers[index].self_attn.register_forward_hook(record)
               for index in model.config.variant_layers]
    with torch.no_grad():
        model(**batch)
    for handle in handles:
        handle.remove()
    runner = VariantAttention(model, model.config.variant_layers)
    with torch.no_grad():
        outputs, loss, important = runner.forward(*runner.inputs(batch))
    assert len(outputs) == len(recorded) == len(model.config.variant_layers)
    for index, output in zip(model.config.variant_layers, outputs, strict=True):
        torch.testing.assert_close(output, recorded[index])
    assert (important is not None) == (row == "rhe") and torch.isfinite(loss)


def test_flop_counts_from_saved_inputs(inputs, tmp_path):
    """scripts/count_flops.py on the benchmark's batches: PR's Eq. 7-8 network adds work in every layer, while
    hybrid's gate and local window add no matrix products."""
    output = tmp_path / "flops.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "count_flops.py"), "--inputs", str(inputs), "--size",
                    "small", "--variants", "phrase_representation", "hybrid", "--gen-tokens", "3", "--output",
                    str(output)], check=True, capture_output=True, text=True, timeout=600)
    rows = json.loads(output.read_text())["rows"]
    assert list(rows) == ["transformer", "phrase_representation", "hybrid"]
    assert rows["transformer"]["train_step_ratio"] == 1.0 and rows["transformer"]["train_step_gflops"] > 0
    assert rows["phrase_representation"]["train_step_ratio"] > 1.3
    assert rows["phrase_representation"]["generation_ratio"] > 1.3
    assert rows["hybrid"]["train_step_ratio"] == pytest.approx(1.0, abs=0.01)
    table = output.with_suffix(".md").read_text()
    assert all(f"| {name} |" in table for name in rows)

    # a wider vocabulary (--vocab-size) adds the same output-layer work to every row: 2 FLOPs per multiply-add,
    # forward and the backward pass's two products, for each label position of each batch
    wide = tmp_path / "flops-wide.json"
    tokenizer_vocab = torch.load(inputs)["vocab"]["vocab_size"]
    subprocess.run([sys.executable, str(REPO / "scripts" / "count_flops.py"), "--inputs", str(inputs), "--size",
                    "small", "--variants", "phrase_representation", "--gen-tokens", "3", "--vocab-size",
                    str(tokenizer_vocab + 1000), "--output", str(wide)], check=True, capture_output=True, text=True,
                   timeout=600)
    wide_rows = json.loads(wide.read_text())["rows"]
    label_positions = sum(batch["labels"].numel() for batch in torch.load(inputs)["train_batches"])
    d_model = 256
    for name, row in wide_rows.items():
        added = (row["train_step_gflops"] - rows[name]["train_step_gflops"]) * 1e9
        assert added == pytest.approx(3 * 2 * label_positions * d_model * 1000, rel=1e-6), name
    assert wide_rows["phrase_representation"]["train_step_ratio"] < rows["phrase_representation"]["train_step_ratio"]
