"""`scripts/bench_serving.py`, the CPU serving benchmark, on tiny fresh models with PyTorch `generate` (the ONNX
engines are checked by test_onnx_generation.py): `--fixed-new-tokens` gives every sentence exactly that many new
tokens, the fresh models take `--backbones` and `--vocab-size`, rows carry the CPU time and, for the types that read
syntax, the end-to-end speed with the parse, and a report of other settings is refused."""

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K, tiny_sizes
from transformers import AutoModelForSeq2SeqLM


# the benchmark tools' own tests: not in the default run (setup.cfg), CI runs them with `-m benchmark_tools`
pytestmark = [pytest.mark.benchmark_tools, pytest.mark.usefixtures("one_thread")]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench_serving  # noqa: E402


TINY = json.dumps({key: value for key, value in tiny_sizes().items() if key != "max_position_embeddings"})


def arguments(tmp_path, processor_folder, *extra):
    return ["--processor", str(processor_folder), "--source", f"{MULTI30K}/val.en.gz", "--reference",
            f"{MULTI30K}/val.de.gz", "--sentences", "3", "--batch-sizes", "2", "--beams", "2", "--threads", "1",
            "--engines", "pytorch", "--model-fields", TINY, "--work-dir", str(tmp_path / "work"),
            "--output", str(tmp_path / "serving.json"), *extra]


@pytest.fixture(scope="module")
def processor_folder(multi30k_processor, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serving_processor")
    multi30k_processor.save_pretrained(folder)
    return folder


def test_fixed_new_tokens_fill_every_row(tmp_path, processor_folder, multi30k_processor):
    args = bench_serving.parse_args(arguments(tmp_path, processor_folder, "--fixed-new-tokens", "6"))
    assert args.max_new_tokens == 6
    folder = bench_serving.model_folder(args, "transformer", "marian", {}, multi30k_processor)
    tokenizer = multi30k_processor.tokenizer
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.final_logits_bias[0, tokenizer.eos_token_id] = 100.0  # EOS first everywhere, unless it is held off
    model.save_pretrained(folder)
    outputs = []

    class Recording:  # the processor as the translator sees it, recording `generate`'s outputs
        def __init__(self):
            self.tokenizer = self

        def batch_decode(self, output, **kwargs):
            outputs.append(output)
            return tokenizer.batch_decode(output, **kwargs)

    translate = bench_serving.translator(args, folder, "transformer", "pytorch", 1, Recording())
    batch = {**multi30k_processor(["A dog runs.", "Two men play football in the park."], return_tensors="pt"),
             "texts": []}
    translate([batch], 2)
    (output,) = outputs
    # the decoder start token, then exactly 6 new tokens in every row: no row ended early and was padded
    assert output.shape == (2, 7)
    assert (output[:, 1:] != tokenizer.pad_token_id).all()


def test_fresh_models_take_backbone_size_and_vocabulary(tmp_path, processor_folder, multi30k_processor):
    args = bench_serving.parse_args(arguments(tmp_path, processor_folder, "--vocab-size", "1000"))
    t5 = bench_serving.model_folder(args, "rhe", "t5", {}, multi30k_processor)
    config = json.loads((t5 / "config.json").read_text())
    assert (config["model_type"], config["encoder_type"], config["vocab_size"]) == ("mgsa_t5", "rhe", 1000)
    assert config["d_model"] == 32 and config["num_layers"] == 2
    base = bench_serving.model_sizes("marian", "base")
    assert (base["d_model"], base["encoder_layers"], base["encoder_attention_heads"], base["encoder_ffn_dim"]) == (
        512, 6, 8, 2048)
    assert bench_serving.model_sizes("t5", "default")["d_kv"] * 4 == bench_serving.model_sizes("t5", "default")[
        "d_model"]


def test_rows_carry_cpu_time_and_end_to_end_speed(tmp_path, processor_folder):
    torch.manual_seed(0)
    bench_serving.main(arguments(tmp_path, processor_folder, "--types", "transformer", "rhe", "--backbones", "marian",
                                 "t5", "--fixed-new-tokens", "4"))
    report = json.loads((tmp_path / "serving.json").read_text())
    rows = {(row["backbone"], row["encoder_type"]): row for row in report["rows"]}
    assert set(rows) == {(backbone, kind) for backbone in ("marian", "t5") for kind in ("transformer", "rhe")}
    for (_, kind), row in rows.items():
        assert row["cpu_ms_per_sentence"] > 0
        if kind == "rhe":  # reads the parse: text in, translation out, is slower than the translation alone
            assert row["parse_seconds"] > 0
            assert row["end_to_end_sentences_per_second"] < row["sentences_per_second"]
        else:
            assert "end_to_end_sentences_per_second" not in row
    assert (report["size"], report["fixed_new_tokens"]) == ("default", 4)
    assert "| end-to-end sent/s |" in (tmp_path / "serving.md").read_text()

    # a rerun into the same report with other settings would mix rows: refused, naming the file
    with pytest.raises(SystemExit, match="serving.json holds rows measured with"):
        bench_serving.main(arguments(tmp_path, processor_folder, "--size", "base", "--fixed-new-tokens", "4"))


def test_the_one_call_search_gives_generates_translations(tmp_path, processor_folder):
    """`--engines ort-search`: the whole search in one onnxruntime call translates as `generate` does, with a fixed
    number of new tokens (EOS held off until the last one), for a type that reads syntax (the processor's fields go
    to the search graph)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    bench_serving.main(arguments(tmp_path, processor_folder, "--types", "rhe", "--fixed-new-tokens", "5",
                                 "--engines", "pytorch", "ort-search", "--beams", "2", "1"))
    report = json.loads((tmp_path / "serving.json").read_text())
    rows = [row for row in report["rows"] if row["engine"] == "ort-search"]
    assert {(row["encoder_type"], row["beams"]) for row in rows} == {("rhe", 2), ("rhe", 1)}
    assert all(row["identical_to_generate"] == 1.0 and row["speedup_over_generate"] > 0 for row in rows)
    # spinning threads are a setting of the whole report: not mixed with rows measured with waiting ones
    assert report["ort_spinning"] is False and report["cpu"].endswith(" cores")
    with pytest.raises(SystemExit, match="'ort_spinning': False"):
        bench_serving.main(arguments(tmp_path, processor_folder, "--types", "rhe", "--fixed-new-tokens", "5",
                                     "--engines", "ort-search", "--ort-spinning"))
