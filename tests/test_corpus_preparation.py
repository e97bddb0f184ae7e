"""A recipe's corpus prepared once, on disk: the same fields as the processor's `map_dataset` in memory, read back
memory-mapped by every later call, built by the main process while the others wait on the disk (no collective, so
no process-group timeout), and one tokenizer for every machine of a run."""

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from datasets import Dataset

import mgsa_hf.training.corpus as preparation
from mgsa_hf.cli import main as cli_main
from mgsa_hf.data_collator import MgsaDataCollator
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.catalogue import accelerate_config_path
from mgsa_hf.training.config import load_train_config, source_syntax_fields
from mgsa_hf.training.corpus import prepare, tokenizer_sample
from mgsa_hf.training.data import load_parallel_corpus
from mgsa_hf.training.trainer import column_lengths


pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
LAUNCH_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}


def recipe(tmp_path, *overrides):
    return load_train_config(TINY, [f"data={DATA}", f"output_dir={tmp_path / 'model'}", "model.encoder_type=rhe",
                                    "max_train_samples=40", *overrides])


def test_prepared_once_equal_to_mapping_in_memory(tmp_path, monkeypatch):
    """The prepared splits equal `map_dataset` over the corpus held in memory; they are read from the prepared
    folder's Arrow files; a second call loads them without building anything."""
    config = recipe(tmp_path)
    corpus, processor, processed = prepare(config)
    folders = sorted(path.name.split("-")[0] for path in (tmp_path / "model-run" / "prepared").iterdir())
    assert folders == ["corpus", "parsed", "processed"]
    in_memory = load_parallel_corpus(DATA, "en", "de", config.splits)
    in_memory = in_memory.__class__({split: data.select(range(min(len(data), limit))) for (split, data), limit
                                     in zip(in_memory.items(), (40, 8, 8), strict=True)})
    collator = MgsaDataCollator(tokenizer=processor.tokenizer)
    # RHE's fields alone: MG-SA's phrases and tags and PR's phrases are not made nor stored
    stored = ("word_ids", "head_word_ids", "local_phrase_start", "local_phrase_end", "tree_depth")
    assert source_syntax_fields(config) == stored
    for split, limit in (("train", 32), ("validation", 64), ("test", 64)):  # the scored splits: the positions only
        expected = processor.map_dataset(in_memory[split].flatten(), "translation.en", "translation.de",
                                         max_length=limit, max_target_length=limit, truncation=True,
                                         syntax_fields=stored)
        assert processed[split].column_names == ["input_ids", *stored, "labels"]
        assert processed[split][:] == expected.remove_columns("attention_mask")[:]
        assert corpus[split][:] == in_memory[split][:]
        assert all(str(tmp_path) in file["filename"] for file in processed[split].cache_files)
        # stored in narrow integers without the all-ones mask; collated, the same tensors as the processor's
        rows = list(processed[split].select(range(8)))
        batch, reference = collator(rows), collator(list(expected.select(range(8))))
        assert batch.keys() == reference.keys() and all(torch.equal(batch[key], reference[key]) for key in batch)
        assert all(batch[key].dtype == torch.long for key in batch)
    types = {column: feature.feature.dtype if column not in ("phrase_ids", "phrase_tags") else
             feature.feature.feature.dtype for column, feature in processed["train"].features.items()}
    assert types["input_ids"] == types["labels"] == types["word_ids"] == types["tree_depth"] == "int16"
    assert "attention_mask" not in types

    def no_build(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(preparation, "build_corpus", no_build)
    monkeypatch.setattr(preparation, "build_processed", no_build)
    monkeypatch.setattr(preparation, "build_parsed", no_build)
    started = time.perf_counter()
    _, _, again = prepare(config)
    assert time.perf_counter() - started < 10 and again["train"][:] == processed["train"][:]
    assert list(column_lengths(again["train"], "input_ids")) == [len(ids) for ids in processed["train"]["input_ids"]]


def test_corpus_key_follows_content_not_path_or_times(tmp_path):
    """The corpus step's key: the same files at two paths give one key (two machines need not agree on paths); a file
    changed in place with its size and modification time restored (`cp -p`, `rsync -t`) gives a new key, as does a
    renamed file; the tokenizer's record names the corpus by that key."""
    from mgsa_hf.training.corpus import content_key, corpus_parts, tokenizer_record

    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        for name in ("train", "val", "test_2016_flickr"):
            for lang in ("en", "de"):
                lines = list(read_lines(DATA / f"{name}.{lang}.gz", 20))
                (tmp_path / folder / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def key(folder):
        return content_key(corpus_parts(recipe(tmp_path, f"data={tmp_path / folder}")))

    first = key("a")
    assert key("b/c") == first
    changed = tmp_path / "a" / "train.en"
    stat = changed.stat()
    text = changed.read_text(encoding="utf-8")
    changed.write_text(text.replace("A", "a", 1), encoding="utf-8")  # same size
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert changed.stat().st_size == stat.st_size and changed.stat().st_mtime_ns == stat.st_mtime_ns
    assert key("a") != first
    changed.write_text(text, encoding="utf-8")
    assert key("a") == first
    (tmp_path / "b" / "c" / "val.de").rename(tmp_path / "b" / "c" / "val.fr")
    assert key("b/c") != first
    config = recipe(tmp_path, f"data={tmp_path / 'a'}")
    assert tokenizer_record(config, key("a"))["corpus"] == first


def test_a_value_outside_its_narrow_type_stops_the_step_by_name(tmp_path, monkeypatch):
    """A processed field whose value does not fit the integer type it is stored as stops the preparation, naming the
    split, the row, the field and the value; nothing is left as a prepared folder."""
    monkeypatch.setitem(preparation.FIELD_TYPES, "tree_depth", "int8")
    original = preparation._NarrowRows.__call__

    def deep_tree(self, batch, indices):
        rows = self.processor._map_batch(batch, indices, **self.fn_kwargs)
        if 3 in indices:
            rows["tree_depth"][indices.index(3)][0] = 200
        monkeypatch.setattr(self.processor, "_map_batch", lambda *args, **kwargs: rows)
        return original(self, batch, indices)

    monkeypatch.setattr(preparation._NarrowRows, "__call__", deep_tree)
    with pytest.raises(ValueError, match=r"the train split, row 3: `tree_depth` holds 200, outside the int8"):
        prepare(recipe(tmp_path))
    assert not list((tmp_path / "model-run" / "prepared").glob("processed-*[!d]"))


def test_cleaning_drops_pairs_by_length_and_ratio(tmp_path):
    """`clean_min_words`/`clean_max_words`/`clean_max_ratio` keep the training pairs Moses' clean-corpus-n keeps, count
    what they drop by reason in the corpus step's record, are part of its key, and are checked by name."""
    from mgsa_hf.training.corpus import content_key, corpus_parts, corpus_record

    folder = tmp_path / "data"
    folder.mkdir()
    train = [("A dog runs .", "Ein Hund rennt ."), ("", "Leer ."), ("one " * 12, "eins " * 12),
             ("A man .", "Ein Mann steht da und schaut ."), ("Two cats .", "Zwei Katzen .")]
    for name, pairs in (("train", train), ("val", train[:1]), ("test_2016_flickr", train[:1])):
        for side, lang in enumerate(("en", "de")):
            (folder / f"{name}.{lang}").write_text("\n".join(pair[side] for pair in pairs) + "\n", encoding="utf-8")
    plain = recipe(tmp_path, f"data={folder}", "model.encoder_type=transformer", "vocab_size=60")
    config = recipe(tmp_path, f"data={folder}", "model.encoder_type=transformer", "vocab_size=60",
                    "clean_min_words=1", "clean_max_words=10", "clean_max_ratio=1.5")
    assert content_key(corpus_parts(config)) != content_key(corpus_parts(plain))
    corpus, _, processed = prepare(config)
    assert [pair["en"] for pair in corpus["train"]["translation"]] == ["A dog runs .", "Two cats ."]
    assert len(processed["train"]) == 2 and len(corpus["validation"]) == 1
    assert corpus_record(config)["dropped"] == {"rule": {"min_words": 1, "max_words": 10, "max_ratio": 1.5},
                                                "pairs": 5, "too_short": 1, "too_long": 1, "ratio": 1}
    for key, value in (("clean_max_ratio", 0.5), ("clean_min_words", -1), ("clean_max_words", "many")):
        with pytest.raises(ValueError, match=key):
            prepare(recipe(tmp_path, f"data={folder}", f"{key}={value}"))
    wmt14 = load_train_config("wmt14", [f"output_dir={tmp_path / 'wmt'}"])
    assert (wmt14.clean_min_words, wmt14.clean_max_words, wmt14.clean_max_ratio) == (1, 250, 1.5)


def test_other_processes_wait_for_the_main_one(tmp_path):
    """A process that is not the main one waits on the disk until the main one has prepared, then loads the same;
    when the main one fails, the wait ends with its error."""
    config = recipe(tmp_path, "max_train_samples=16")
    results = {}
    waiting = threading.Thread(target=lambda: results.setdefault("other", prepare(config, is_main=False)))
    waiting.start()
    time.sleep(3)
    assert waiting.is_alive() and not (tmp_path / "model-run" / "prepared").exists()
    main = prepare(config, is_main=True)
    waiting.join(timeout=60)
    assert results["other"][2]["train"][:] == main[2]["train"][:]

    broken = recipe(tmp_path / "broken", "max_train_samples=16", "data=" + str(tmp_path / "no-corpus"))
    (tmp_path / "no-corpus").mkdir()
    with pytest.raises(FileNotFoundError):
        prepare(broken, is_main=True)
    with pytest.raises(RuntimeError, match="failed to prepare the corpus.*no file for split"):
        prepare(broken, is_main=False)


def test_text_files_are_read_in_batches_and_checked(tmp_path):
    """Split files of different lengths are refused, naming both; the tokenizer's sample is drawn evenly."""
    (tmp_path / "corpus").mkdir()
    for name, lines in (("train.en", ["a b", "c d", "e f"]), ("train.de", ["a", "b"]), ("val.en", ["x"]),
                        ("val.de", ["y"])):
        (tmp_path / "corpus" / name).write_text("\n".join(lines) + "\n")
    config = recipe(tmp_path, f"data={tmp_path / 'corpus'}", "splits={train: train, validation: val}",
                    "max_train_samples=null")
    with pytest.raises(ValueError, match=r"train.en and .*train.de differ in length"):
        prepare(config)
    rows = Dataset.from_dict({"translation": [{"en": str(i), "de": str(i)} for i in range(10)]})
    assert tokenizer_sample(rows, "en", 4) == ["0", "2", "5", "7"] and len(tokenizer_sample(rows, "de", None)) == 10


def test_two_processes_prepare_past_a_10_second_group_timeout(tmp_path):
    """Under `accelerate launch` with two CPU processes and `training.ddp_timeout=10`, the main process parses for
    longer than that (a tree plug-in that takes 0.5 s a sentence) while the other waits on the disk: the run
    finishes, the main process alone having built the corpus and trained the tokenizer."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config_path("cpu_2proc")), "--main_process_port", "29571",
        str(REPO / "tests" / "scripts" / "train_and_record_tokenizer.py"), str(TINY),
        f"data={DATA}", f"output_dir={tmp_path / 'model'}", "model.encoder_type=rhe",
        "processor.tree_parser=tree_plugins:slow_tree", "max_train_samples=24", "max_eval_samples=2",
        "max_test_samples=2", "training.max_steps=2", "training.eval_strategy=no", "training.save_strategy=no",
        "training.ddp_timeout=10",
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=LAUNCH_ENV, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert time.perf_counter() - started > 14  # 28 sentences at 0.5 s: the parse alone outlasts the timeout
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [rank["global_step"] for rank in ranks] == [2, 2]
    # the corpus, the parse and the fields
    assert ranks[0]["built"] == [True, True, True] and ranks[1]["built"] == [False, False, False]
    assert ranks[0]["vocabulary"] == ranks[1]["vocabulary"]


def test_two_machines_share_one_tokenizer(tmp_path):
    """Two machine ranks (one process each, on this host, with a shared folder) and `prepare_in_shards`: only the
    run's main process trains the tokenizer and reads the corpus; each process tokenizes its half of it, joined into
    one prepared folder; both train with the same vocabulary."""
    common = ["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", "29575", "--rdzv_backend", "static", "--same_network"]
    script = [str(REPO / "tests" / "scripts" / "train_and_record_tokenizer.py"), str(TINY), f"data={DATA}",
              f"output_dir={tmp_path / 'model'}", "model.encoder_type=transformer", "max_train_samples=200",
              "vocab_size=400", "training.max_steps=2", "training.eval_strategy=no", "training.save_strategy=no",
              "max_eval_samples=2", "max_test_samples=2", "prepare_in_shards=true"]
    machines = [subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", *common,
                                  "--machine_rank", str(rank), *script], cwd=tmp_path, env=LAUNCH_ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [machine.communicate(timeout=600) for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["built"] == [True] and ranks[1]["built"] == [False]  # the corpus step; the fields in shards
    assert ranks[0]["vocabulary"] == ranks[1]["vocabulary"]
    records = list((tmp_path / "model-run" / "prepared").glob("processed-*/prepared.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["shards"] == 2


@pytest.mark.parametrize(("data", "port"), [("same", 29577), ("one line differs", 29579)])
def test_two_machines_that_prepare_apart(tmp_path, data, port, monkeypatch):
    """Two machine ranks without a shared folder (each its own working directory, copy of the data and run folder,
    each training its own tokenizer), the second prepared beforehand by `mgsa-hf prepare`: with the same data both
    train, on identical vocabularies; with one sentence changed on the second machine both processes stop before
    training, naming that machine's rank and what differs (DDP would have averaged the gradients of two corpora, or of
    two vocabularies' embeddings)."""
    machines = [tmp_path / "machine-0", tmp_path / "machine-1"]
    for number, machine in enumerate(machines):
        (machine / "data").mkdir(parents=True)
        for name in ("train", "val", "test_2016_flickr"):
            for lang in ("en", "de"):
                lines = list(read_lines(DATA / f"{name}.{lang}.gz", 200))
                if number == 1 and data != "same" and name == "train" and lang == "en":
                    lines[5] = "A purple elephant juggles seven umbrellas on a frozen lake."
                (machine / "data" / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = ["data=data", "output_dir=model", "vocab_size=400", "model.encoder_type=transformer",
                 "training.max_steps=2", "training.eval_strategy=no", "training.save_strategy=no",
                 "max_eval_samples=2", "max_test_samples=2"]
    # `mgsa-hf prepare` on the second machine, run in this process (one interpreter fewer to start)
    monkeypatch.chdir(machines[1])
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        cli_main(["prepare", str(TINY), *overrides])
    assert json.loads(printed.getvalue())["parsed"] is False  # a model that reads no syntax: no parse
    monkeypatch.chdir(tmp_path)
    common = ["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port), "--rdzv_backend", "static", "--same_network"]
    script = [str(REPO / "tests" / "scripts" / "train_and_record_tokenizer.py"), str(TINY), *overrides]
    launches = [subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", *common,
                                  "--machine_rank", str(rank), *script], cwd=machine, env=LAUNCH_ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for rank, machine in enumerate(machines)]
    outputs = [launch.communicate(timeout=600) for launch in launches]
    errors = outputs[0][1][-3000:] + outputs[1][1][-3000:]
    if data == "same":
        assert [launch.returncode for launch in launches] == [0, 0], errors
        ranks = [json.loads((machine / f"rank{rank}.json").read_text()) for rank, machine in enumerate(machines)]
        assert ranks[0]["vocabulary"] == ranks[1]["vocabulary"] and ranks[1]["built"] == [False, False]
    else:
        assert all(launch.returncode != 0 for launch in launches), errors
        for _, stderr in outputs:
            assert "did not prepare the same inputs as rank 0" in stderr and "rank 1 on" in stderr, stderr[-3000:]
            assert "the processed train split" in stderr
        assert not any((machine / "model" / "config.json").exists() for machine in machines)


def test_scored_splits_are_translated_whole(tmp_path):
    """Validation and test are scored on whole sources: `max_source_length` cuts the training split alone; a source
    longer than the model's positions is cut to them, and the results and the card say how many were."""
    from mgsa_hf.training.run import train

    config = recipe(tmp_path, "model.encoder_type=transformer", "max_source_length=8", "max_target_length=8",
                    "model.max_position_embeddings=24", "training.max_steps=2", "training.eval_strategy=no",
                    "training.save_strategy=no")
    results, _ = train(config)
    _, processor, processed = prepare(config)
    assert max(len(ids) for ids in processed["train"]["input_ids"]) <= 8
    test_lengths = [len(ids) for ids in processed["test"]["input_ids"]]
    assert max(test_lengths) == 24 and min(test_lengths) > 8
    sources = [pair["en"] for pair in prepare(config)[0]["test"]["translation"]]
    longer = sum(len(ids) > 24 for ids in processor.tokenizer(sources)["input_ids"])
    row = next(row for row in results["scores"] if row["split"] == "test")
    assert longer > 0 and row["cut_sources"] == longer and row["source_limit"] == 24
    saved = json.loads((tmp_path / "model-run" / "results.json").read_text())
    assert saved["scores"][1]["cut_sources"] == longer
    # the card names the split as the Hub's copy of Multi30k does (bentrevett/multi30k: test)
    assert f"{longer} of test_2016_flickr's were longer than the model's 24 positions" in \
        (tmp_path / "model" / "README.md").read_text()


@pytest.mark.parametrize("layout", ["parquet", "save_to_disk"])
def test_a_folder_of_arrow_tables_is_a_corpus(tmp_path, layout):
    """A folder of `{split}.parquet` files (a column per language) or a `save_to_disk` folder (a `translation`
    column) is prepared as the same text files are; a stream is refused by name where a whole dataset is needed."""
    from datasets import DatasetDict, IterableDataset

    from mgsa_hf.training.trainer import MgsaSeq2SeqTrainer

    text = load_parallel_corpus(DATA, "en", "de", {"train": "train", "validation": "val"})
    text = DatasetDict({split: data.select(range(24)) for split, data in text.items()})
    folder = tmp_path / "tables"
    if layout == "parquet":
        folder.mkdir()
        for split, name in (("train", "train"), ("validation", "val")):
            text[split].flatten().rename_columns({"translation.en": "en", "translation.de": "de"}).to_parquet(
                str(folder / f"{name}.parquet"))
    else:
        DatasetDict({"train": text["train"], "val": text["validation"]}).save_to_disk(str(folder))
    config = recipe(tmp_path, f"data={folder}", "splits={train: train, validation: val}", "max_train_samples=null",
                    "model.encoder_type=transformer")
    corpus, _, processed = prepare(config)
    assert corpus["train"][:] == text["train"][:] and processed["validation"].num_rows == 8  # max_eval_samples
    stream = IterableDataset.from_generator(lambda: iter(processed["train"]))
    processor = prepare(config)[1]
    with pytest.raises(TypeError, match="IterableDataset.*stream"):
        processor.map_dataset(stream, "en")
    trainer = MgsaSeq2SeqTrainer.__new__(MgsaSeq2SeqTrainer)
    trainer.max_tokens_per_batch, trainer.train_dataset = 300, stream
    with pytest.raises(TypeError, match="max_tokens_per_batch.*IterableDataset"):
        trainer.get_train_dataloader()
