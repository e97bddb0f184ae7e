"""`scripts/serving_bound.py`, the fp32 speed bound of serving, on a tiny saved model: the counted FLOPs hold at
least the output projection's at every step, and no engine measured can beat the bound's assumptions (`generate`
takes at least the time of its FLOPs at the machine's fastest matrix product, and at least its forward passes')."""

import json
import sys
from pathlib import Path

import pytest
from conftest import ONNX_EXPORT_LAYERS

from mgsa_hf import MgsaForConditionalGeneration


pytestmark = [pytest.mark.benchmark_tools, pytest.mark.usefixtures("one_thread")]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import serving_bound  # noqa: E402


def test_the_bound_of_a_tiny_model(tmp_path, multi30k_processor, tiny_config):
    config = tiny_config(multi30k_processor, "transformer", **ONNX_EXPORT_LAYERS["marian"])
    MgsaForConditionalGeneration(config).save_pretrained(tmp_path / "model")
    multi30k_processor.save_pretrained(tmp_path / "model")
    output = tmp_path / "bound.json"
    batch_size, beams, new_tokens = 3, 2, 4
    serving_bound.main(["--model", f"transformer={tmp_path / 'model'}", "--batch-size", str(batch_size),
                        "--beams", str(beams), "--new-tokens", str(new_tokens), "--threads", "1", "--repeats", "1",
                        "--output", str(output)])
    report = json.loads(output.read_text())
    (row,) = report["rows"]
    output_projection = 2 * batch_size * beams * config.d_model * config.vocab_size * new_tokens
    assert output_projection <= row["flops"] and row["gflop"] == round(row["flops"] / 1e9, 1)
    assert row["bound"] >= 1 and row["search_bound"] >= 1
    assert row["machine_gflops"] == max(report["rates"]["1"].values())
    assert output.with_suffix(".md").read_text().count("| transformer |") == 1
