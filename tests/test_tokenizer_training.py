"""The run's tokenizer: its record names the corpus and the sample it was learnt from, so a run with another corpus or
sample in the same `output_dir` does not reuse it without a word."""

import json
from types import SimpleNamespace

import pytest
from conftest import MULTI30K_DIR

from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.corpus import load_or_train_tokenizer, tokenizer_record
from mgsa_hf.training.ownership import run_folder


def run_config(output_dir, vocab_size=200, max_sentences=None, resume=None):
    return SimpleNamespace(tokenizer=None, init_from=None, output_dir=output_dir, vocab_size=vocab_size,
                           source_lang="en", target_lang="de", resume_from_checkpoint=resume,
                           tokenizer_max_sentences=max_sentences)


@pytest.fixture(scope="module")
def splits():
    """Two corpora: the first 300 pairs of Multi30k train, and the next 300."""
    pairs = list(zip(read_lines(MULTI30K_DIR / "train.en.gz", 600), read_lines(MULTI30K_DIR / "train.de.gz", 600),
                     strict=True))
    return [{"translation": [{"en": en, "de": de} for en, de in part]} for part in (pairs[:300], pairs[300:])]


def test_another_corpus_or_sample_trains_the_tokenizer_again(splits, tmp_path, caplog):
    """The same `output_dir` with another corpus, or another `tokenizer_max_sentences`: trained again on it, saying
    why; with the same ones, loaded as it is; resuming a run (whose checkpoints embed the tokenizer) with another
    corpus stops, naming it."""
    output_dir = tmp_path / "model"
    folder = run_folder(output_dir) / "tokenizer"
    first = load_or_train_tokenizer(run_config(output_dir), splits[0], corpus_key="corpus-a")
    record = json.loads((folder / "trained_for.json").read_text())
    assert "tokenizer.json" in record.pop("checksums")  # each file's size and SHA-256, checked on loading
    assert record == tokenizer_record(run_config(output_dir), "corpus-a") and record["corpus"] == "corpus-a"
    mtime = (folder / "tokenizer.json").stat().st_mtime_ns
    assert load_or_train_tokenizer(run_config(output_dir), splits[0], corpus_key="corpus-a").get_vocab() == \
        first.get_vocab()
    assert (folder / "tokenizer.json").stat().st_mtime_ns == mtime  # loaded, not trained again

    with pytest.raises(ValueError, match=r"corpus='corpus-a' → 'corpus-b'.*resume with the settings of the run"):
        load_or_train_tokenizer(run_config(output_dir, resume=True), splits[1], corpus_key="corpus-b")
    with caplog.at_level("WARNING"):
        second = load_or_train_tokenizer(run_config(output_dir), splits[1], corpus_key="corpus-b")
    assert "corpus='corpus-a' → 'corpus-b'" in caplog.text and "training it again" in caplog.text
    assert second.get_vocab() != first.get_vocab()
    assert json.loads((folder / "trained_for.json").read_text())["corpus"] == "corpus-b"

    caplog.clear()
    with caplog.at_level("WARNING"):
        load_or_train_tokenizer(run_config(output_dir, max_sentences=100), splits[1], corpus_key="corpus-b")
    assert "max_sentences=None → 100" in caplog.text


def test_a_resumed_run_keeps_a_tokenizer_recorded_before_the_corpus_was(splits, tmp_path):
    """A run folder whose record predates the corpus and sample in it (vocabulary and languages alone) resumes with
    its tokenizer, the one its checkpoints embed; a new run there trains it again."""
    output_dir = tmp_path / "model"
    folder = run_folder(output_dir) / "tokenizer"
    first = load_or_train_tokenizer(run_config(output_dir), splits[0], corpus_key="corpus-a")
    (folder / "trained_for.json").write_text(json.dumps({"vocab_size": 200, "source_lang": "en",
                                                         "target_lang": "de"}))
    resumed = load_or_train_tokenizer(run_config(output_dir, resume=True), splits[0], corpus_key="corpus-a")
    assert resumed.get_vocab() == first.get_vocab()
    with pytest.raises(ValueError, match="vocab_size=200 → 300"):
        load_or_train_tokenizer(run_config(output_dir, vocab_size=300, resume=True), splits[0], corpus_key="corpus-a")
    load_or_train_tokenizer(run_config(output_dir), splits[0], corpus_key="corpus-a")
    assert json.loads((folder / "trained_for.json").read_text())["corpus"] == "corpus-a"


def test_three_trainings_give_identical_files(tmp_path):
    """The joint tokenizer (fast and Marian's SentencePiece format) trained three times on the same data: twice in
    this process and once in another with another hash seed (the order of Python's sets and dicts) and thread
    settings. Byte-identical files, so machines that prepare apart, and the same command run again, learn the same
    ids. (The `tokenizers` unigram trainer, used before, gave the same pieces under other ids each time.)"""
    import hashlib
    import os
    import subprocess
    import sys

    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    script = ("import sys; from mgsa_hf.tokenization_utils import train_joint_tokenizer\n"
              "for kind in ('fast', 'marian'):\n"
              "    train_joint_tokenizer(sys.argv[1], sys.argv[2], f'{sys.argv[3]}/{kind}', vocab_size=600, "
              "max_sentences=1500, tokenizer_type=kind)")
    sources = [str(MULTI30K_DIR / "train.en.gz"), str(MULTI30K_DIR / "train.de.gz")]
    env = {**os.environ, "PYTHONHASHSEED": "7", "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "true"}
    subprocess.run([sys.executable, "-c", script, *sources, str(tmp_path / "training-0")], env=env, check=True,
                   timeout=300)
    for number in (1, 2):
        for kind in ("fast", "marian"):
            train_joint_tokenizer(*sources, tmp_path / f"training-{number}" / kind, vocab_size=600,
                                  max_sentences=1500, tokenizer_type=kind)
    digests = [{str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
                for path in sorted(folder.rglob("*")) if path.is_file()}
               for folder in (tmp_path / f"training-{number}" for number in range(3))]
    assert {"fast/tokenizer.json", "marian/source.spm", "marian/vocab.json"} <= digests[0].keys()
    assert digests[0] == digests[1] == digests[2]
