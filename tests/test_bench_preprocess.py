"""scripts/bench_preprocess.py: its repeats time what one pass over the corpus does, and the script writes its
figures."""

import copy
import json
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
from conftest import MULTI30K_DIR

from mgsa_hf.benchmarking.preprocess import time_chunks
from mgsa_hf.tokenization_utils import read_lines


# the benchmark tools' own tests: not in the default run (setup.cfg), CI runs them with `-m benchmark_tools`
pytestmark = pytest.mark.benchmark_tools
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_preprocess.py"
MULTI30K = MULTI30K_DIR


def test_repeats_start_from_the_conversion_memory_of_one_pass(multi30k_processor):
    """Three repeats per chunk leave the learned conversion with the chains a single pass recalls, and every
    processor repeat of a chunk meets the conversion as that pass would (the chains it has seen before the chunk)."""
    texts = list(islice(read_lines(f"{MULTI30K}/val.en.gz"), 60))
    conversion = multi30k_processor.parser.conversion
    before = copy.deepcopy(vars(conversion))
    # the pass starts with no chains: other tests of this process may have met these sentences already
    conversion._chains.clear()
    memory = copy.deepcopy(vars(conversion))
    for chunk_start in range(0, 60, 20):
        multi30k_processor(texts[chunk_start : chunk_start + 20])
    one_pass = set(conversion._chains)

    vars(conversion).update(copy.deepcopy(memory))
    seen_by_repeats = []
    calls = []

    def processor(chunk):
        calls.append(len(chunk))
        seen_by_repeats.append(set(conversion._chains))
        multi30k_processor(chunk)

    processor.parser = multi30k_processor.parser
    try:
        seconds = time_chunks(processor, lambda chunk: None, texts, 20, 3)
        assert set(conversion._chains) == one_pass and calls == [20] * 9
        assert all(seen == seen_by_repeats[i - i % 3] for i, seen in enumerate(seen_by_repeats))
        assert len(seen_by_repeats[3]) > len(seen_by_repeats[0]) and seconds["wall"]["mgsa_processor"] > 0
    finally:
        vars(conversion).update(before)


def test_script_writes_its_figures(tmp_path):
    output = tmp_path / "preprocess.json"
    subprocess.run([sys.executable, str(SCRIPT), "--source", f"{MULTI30K}/val.en.gz", "--target",
                    f"{MULTI30K}/val.de.gz", "--limit", "150", "--call-batch-size", "50", "--repeats", "2",
                    "--output", str(output)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(output.read_text())
    assert result["sentences"] == 150 and result["settings"]["components"] == ["tok2vec", "tagger", "parser"]
    assert 0 < result["wall_processor_over_spacy"] < 1.5
    parts, total = result["parts_alone_ms_per_sentence"], result["wall_ms_per_sentence"]["mgsa_processor"]
    assert 0 < parts["tokenizer"] < total and 0 < parts["learned_conversion"] < total
