"""End to end: the training recipe on a slice of Multi30k for every encoder type, the saved folder through the Auto
classes and the translation pipeline, resuming, and two CPU processes under `accelerate launch`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoModelForSeq2SeqLM, AutoProcessor, pipeline

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor
from mgsa_hf.evaluation import loop_fraction
from mgsa_hf.training.catalogue import accelerate_config_path
from mgsa_hf.training.config import TrainConfig, load_train_config
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
SOURCES = ["A man rides a bike down the street.", "Two dogs are playing in the snow."]


def tiny_config(output_dir, *overrides) -> TrainConfig:
    return load_train_config(TINY, [f"data={DATA}", f"output_dir={output_dir}", *overrides])


@pytest.mark.parametrize("encoder_type", ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"])
def test_train_save_load_and_translate(tmp_path, encoder_type):
    results, _ = train(tiny_config(tmp_path, f"model.encoder_type={encoder_type}"))
    assert results["global_step"] == 4
    assert {row["split"] for row in results["scores"]} == {"validation", "test"}
    # after 4 steps a model may say one word for every source: the scores are in range, and every source translated
    assert all(0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["chrf"] <= 100.0 for row in results["scores"])
    for split in ("validation", "test"):
        assert len((run_folder(tmp_path) / f"{split}.hyp.de").read_text(encoding="utf-8").splitlines()) == 8
    assert json.loads((run_folder(tmp_path) / "results.json").read_text())["encoder_type"] == encoder_type

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    processor = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(model, MgsaForConditionalGeneration) and model.config.encoder_type == encoder_type
    assert isinstance(processor, MgsaProcessor)

    generate_kwargs = dict(num_beams=2, max_new_tokens=8)
    with torch.no_grad():
        output_ids = model.generate(**processor(SOURCES, return_tensors="pt"), **generate_kwargs)
    expected = [text.strip() for text in processor.tokenizer.batch_decode(output_ids, skip_special_tokens=True)]
    translator = pipeline("translation", model=str(tmp_path), device="cpu")
    assert [row["translation_text"] for row in translator(SOURCES, **generate_kwargs)] == expected
    assert translator(SOURCES[0], **generate_kwargs) == [{"translation_text": expected[0]}]


def test_transformer_run_skips_the_parse(tmp_path):
    """A model that reads no syntax is trained and served without spaCy: its processor makes only token ids."""
    train(tiny_config(tmp_path, "training.max_steps=1"))
    processor = AutoProcessor.from_pretrained(tmp_path)
    assert processor.with_syntax is False and processor.parser._nlp is None
    encoding = processor(SOURCES, return_tensors="pt")
    assert set(encoding) == {"input_ids", "attention_mask"}
    assert processor.parser._nlp is None
    assert "reads no syntax" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("training.eval_strategy=no", "eval_strategy", "no"),  # YAML 1.1 would read False
        ("training.run_name=off", "run_name", "off"),  # YAML 1.1 would read False
        ("training.learning_rate=1e-3", "learning_rate", 0.001),  # YAML 1.1 would read the string "1e-3"
        ("training.predict_with_generate=false", "predict_with_generate", False),
        ("training.max_steps=7", "max_steps", 7),
    ],
)
def test_overrides_read_yaml_1_2_scalars(tmp_path, override, key, value):
    config = tiny_config(tmp_path, override)
    assert config.training[key] == value and type(config.training[key]) is type(value)


def test_eval_strategy_no_trains(tmp_path):
    results, _ = train(tiny_config(tmp_path, "training.max_steps=1", "training.eval_strategy=no"))
    assert results["global_step"] == 1


@pytest.fixture(scope="module")
def trained_tiny(tmp_path_factory):
    """A transformer trained for two steps, with a `generation` setting: (results, output folder)."""
    folder = tmp_path_factory.mktemp("tiny")
    results, _ = train(tiny_config(folder, "training.max_steps=2", "generation.no_repeat_ngram_size=3"))
    return results, folder


def test_the_generation_section_reaches_the_saved_generation_config(trained_tiny):
    from transformers import GenerationConfig

    _, folder = trained_tiny
    saved = GenerationConfig.from_pretrained(folder)
    assert saved.no_repeat_ngram_size == 3 and saved.num_beams == load_train_config(
        "tiny", []).training.get("generation_num_beams", 1)


def test_model_card_carries_scores(trained_tiny):
    from huggingface_hub import ModelCard

    results, folder = trained_tiny
    card = ModelCard.load(folder / "README.md")
    measured = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    for row in results["scores"]:
        split = row["split"]  # the local Multi30k is bentrevett/multi30k's copy: the card uses the Hub's split names
        assert measured[(split, "bleu")] == pytest.approx(row["bleu"], abs=0.01)
        assert measured[(split, "chrf")] == pytest.approx(row["chrf"], abs=0.01)
        # the share of distinct translations, so that a model writing one sentence for every input shows it; the
        # table names the split by the corpus's own name
        corpus_split = {"validation": "val", "test": "test_2016_flickr"}[split]
        assert (f"| `{corpus_split}` (the Hub's `{split}`) | {row['bleu']:.2f} | {row['chrf']:.2f} | "
                f"{100 * row['distinct_fraction']:.1f}% | {100 * row['loop_fraction']:.1f}% |") in card.text
        hypotheses = (run_folder(folder) / f"{split}.hyp.de").read_text().splitlines()
        assert row["loop_fraction"] == loop_fraction(hypotheses)
        assert f"{100 * row['loop_fraction']:.1f}% of `{corpus_split}`'s translations" in card.text
    # the run's generation section, in the card's decoding settings and its word on loops
    assert "`no_repeat_ngram_size=3`" in card.text and "never writes the same 3 subwords twice" in card.text
    assert "transformer" in card.data.tags and card.data.pipeline_tag == "translation"


def test_translate_script_matches_pipeline(trained_tiny, tmp_path):
    _, folder = trained_tiny
    (tmp_path / "src.en").write_text("\n".join(SOURCES) + "\n")
    command = [sys.executable, "-m", "mgsa_hf.cli", "translate", str(folder), "--input", str(tmp_path / "src.en"),
               "--output", str(tmp_path / "hyp.de"), "--num-beams", "2", "--max-new-tokens", "8", "--batch-size", "1"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    translator = pipeline("translation", model=str(folder), device="cpu")
    expected = [row["translation_text"] for row in translator(SOURCES, num_beams=2, max_new_tokens=8)]
    assert (tmp_path / "hyp.de").read_text().splitlines() == expected


def test_remote_pipeline_without_the_package(trained_tiny, tmp_path):
    """The saved folder carries the pipeline and processor code: `pipeline(model=folder, trust_remote_code=True)`
    translates in a process where `mgsa_hf` cannot be imported, as the registered pipeline does."""
    _, folder = trained_tiny
    script = (
        "import sys, json\n"
        "sys.modules['mgsa_hf'] = None\n"
        "from transformers import pipeline\n"
        f"translator = pipeline(model={str(folder)!r}, trust_remote_code=True, device='cpu')\n"
        f"rows = translator({SOURCES!r}, num_beams=2, max_new_tokens=8)\n"
        "print(json.dumps([row['translation_text'] for row in rows]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    translator = pipeline("translation", model=str(folder), device="cpu")
    expected = [row["translation_text"] for row in translator(SOURCES, num_beams=2, max_new_tokens=8)]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_runs_with_one_seed_repeat_and_cpu_memory_reuse_is_asked_for(tmp_path, one_thread, monkeypatch):
    """The model is initialised from `training.seed`: whatever the random state before, two runs with one seed and
    one tokenizer end with the same weights, and another seed gives others (a tokenizer trained anew can differ in a
    few ids: `tokenizers`' unigram trainer sums in hash-map order). `reuse_cpu_memory` calls
    `reuse_freed_cpu_memory` once, before training on CPU (what it does is tested below, in a process of its own)."""
    from mgsa_hf.training import run as training

    calls = []
    monkeypatch.setattr(training, "reuse_freed_cpu_memory", lambda: calls.append("reuse") or True)
    common = ("training.max_steps=1", "training.eval_strategy=no")
    _, first = train(tiny_config(tmp_path / "first", *common, "reuse_cpu_memory=true"))
    assert calls == ["reuse"]
    torch.manual_seed(1234)
    torch.rand(1000)
    common += (f"tokenizer={run_folder(tmp_path / 'first') / 'tokenizer'}",)
    _, again = train(tiny_config(tmp_path / "again", *common))
    _, other = train(tiny_config(tmp_path / "other", *common, "training.seed=7"))
    assert calls == ["reuse"]  # tiny.yaml leaves the allocator alone
    for name, tensor in first.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, atol=0, rtol=0, msg=name)
    assert not torch.equal(other.model.shared.weight, first.model.shared.weight)


def test_a_model_that_ignores_its_source_is_reported(tmp_path, one_thread, capsys):
    """`mgsa-hf train` prints each split's share of distinct translations (from the saved translations) and warns
    when it is under half, the mark of a model that writes the same sentence for every input; a model that reads its
    source gets no warning."""
    import argparse

    from mgsa_hf.training.run import COLLAPSED_FRACTION, run_train

    def run(name, *overrides):
        capsys.readouterr()
        results = run_train(argparse.Namespace(config=str(TINY), overrides=[
            f"data={DATA}", f"output_dir={tmp_path / name}", "training.eval_strategy=no", *overrides]))
        hypotheses = (run_folder(tmp_path / name) / "test.hyp.de").read_text().splitlines()
        test = next(row for row in results["scores"] if row["split"] == "test")
        assert test["distinct_fraction"] == len(set(hypotheses)) / len(hypotheses)
        captured = capsys.readouterr()
        return test["distinct_fraction"], captured.out + captured.err

    fraction, output = run("one-step", "training.max_steps=1")  # a one-step model writes one sentence
    assert output.count("WARNING: the model writes the same few sentences") == 1
    assert fraction < COLLAPSED_FRACTION and "WARNING: the model writes the same few sentences" in output
    assert f"{fraction:.1%} distinct" in output
    # trained on 8 sentences until it knows them, and tested on them: it reads its source
    fraction, output = run("trained", "training.max_steps=300", "max_train_samples=8",
                           "splits={train: train, validation: train, test: train}")
    assert fraction >= COLLAPSED_FRACTION and "WARNING" not in output


def test_reused_cpu_memory_is_not_faulted_in_again():
    """After `reuse_freed_cpu_memory`, a process that allocates, fills and frees a 64 MiB tensor again and again
    takes its pages from what it freed: few page faults, against 64 MiB of fresh pages per tensor without it
    (glibc maps blocks that large alone and unmaps them when freed)."""
    code = (
        "import json, resource, sys, torch\n"
        "from mgsa_hf.training.cpu_memory import reuse_freed_cpu_memory\n"
        "applied = reuse_freed_cpu_memory() if sys.argv[1] == 'reuse' else None\n"
        "torch.ones(16 * 2**20)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(16):\n"
        "    torch.ones(16 * 2**20).sum()\n"
        "print(json.dumps([applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before]))\n"
    )

    def faults(mode):
        result = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True)
        return json.loads(result.stdout.strip().splitlines()[-1])

    (_, default), (applied, reused) = faults("default"), faults("reuse")
    if not applied:
        pytest.skip("not glibc on Linux: reuse_freed_cpu_memory does nothing here")
    # the heap may grow a few times more before the blocks fit (alignment): at most 5 of the 16 tensors fresh (the
    # lowest versions' torch once took 4 fresh tensors and 7 pages more)
    pages = 16 * 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert default > pages / 2 and reused < 5 * pages / 16, (default, reused)


@pytest.mark.parametrize("batching", [[], ["max_tokens_per_batch=800"]], ids=["sentences", "tokens"])
def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path, one_thread, batching):
    """Stopped after checkpoint-2 and resumed (`resume_from_checkpoint=true`: the last checkpoint in the run folder),
    a run reaches step 4 with the weights and the logged losses of the uninterrupted run (CPU, one thread: the Trainer
    restores the data order and the RNG states, dropout included). With token-count batches (3 per epoch of the 64
    sentences here) the resumed run skips into the middle of the first epoch and then draws the second epoch's
    order."""
    import argparse

    from mgsa_hf.training.run import run_train

    _, model = train(tiny_config(tmp_path, "training.max_steps=4", *batching))
    uninterrupted = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    checkpoints = run_folder(tmp_path) / "checkpoints"
    logged = json.loads((checkpoints / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    shutil.rmtree(checkpoints / "checkpoint-4")
    assert (checkpoints / "checkpoint-2").is_dir()
    results = run_train(argparse.Namespace(config=str(TINY), overrides=[
        f"data={DATA}", f"output_dir={tmp_path}", "training.max_steps=4", "resume_from_checkpoint=true", *batching]))
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert results["global_step"] == 4
    state = json.loads((checkpoints / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    if batching:
        assert 1 < state["epoch"] < 2, state["epoch"]

    def losses(history):
        entries = [entry for entry in history if "loss" in entry]
        return [entry["step"] for entry in entries], [entry["loss"] for entry in entries]

    (steps, values), (expected_steps, expected_values) = losses(state["log_history"]), losses(logged)
    assert steps == expected_steps == [2, 4]
    assert values == pytest.approx(expected_values, rel=1e-5)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, uninterrupted[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_collapsed_encoder_restarts_with_the_next_seed(tmp_path, one_thread, capsys):
    """With `collapse_check_step`, a run whose encoder token spread is under `collapse_min_spread` at that step stops
    there and starts again from a new initialisation with the next seed; the last attempt is not checked. Forced here
    with a limit no encoder reaches (2.0); at 0 no run restarts."""
    import argparse

    from mgsa_hf.training.run import run_train

    results = run_train(argparse.Namespace(config=str(TINY), overrides=[
        f"data={DATA}", f"output_dir={tmp_path / 'forced'}", "training.max_steps=4", "training.eval_strategy=no",
        "collapse_check_step=2", "collapse_min_spread=2.0", "collapse_restarts=1"]))
    assert "seed 0: the encoder had collapsed at step 2" in capsys.readouterr().out
    assert [(row["seed"], row["step"]) for row in results["restarts"]] == [(0, 2)]
    assert 0 < results["restarts"][0]["encoder_token_spread"] < 2.0
    assert results["seed"] == 1 and results["global_step"] == 4
    state = json.loads((run_folder(tmp_path / "forced") / "checkpoints" / "checkpoint-4" / "trainer_state.json")
                       .read_text())
    assert not any("encoder_token_spread" in entry for entry in state["log_history"])  # the second run's history
    saved = json.loads((run_folder(tmp_path / "forced") / "results.json").read_text())
    assert saved["restarts"] == results["restarts"]
    _, seeded = train(tiny_config(tmp_path / "seed1", "training.max_steps=4", "training.eval_strategy=no",
                                  "training.seed=1", f"tokenizer={run_folder(tmp_path / 'forced') / 'tokenizer'}"))
    restarted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "forced")
    for name, tensor in seeded.state_dict().items():  # the restart is the run of seed 1
        torch.testing.assert_close(restarted.state_dict()[name], tensor, msg=name)

    results, _ = train(tiny_config(tmp_path / "healthy", "training.max_steps=4", "training.eval_strategy=no",
                                   "collapse_check_step=2", "collapse_min_spread=0.0"))
    assert "restarts" not in results and results["seed"] == 0
    state = json.loads((run_folder(tmp_path / "healthy") / "checkpoints" / "checkpoint-4" / "trainer_state.json")
                       .read_text())
    assert [entry["step"] for entry in state["log_history"] if "encoder_token_spread" in entry] == [2]

    # a resumed run that collapses starts the next seed from its initialisation, not from the deleted checkpoint
    resume = f"resume_from_checkpoint={run_folder(tmp_path / 'healthy') / 'checkpoints' / 'checkpoint-2'}"
    results, _ = train(tiny_config(tmp_path / "healthy", "training.max_steps=4", "training.eval_strategy=no",
                                   "collapse_check_step=3", "collapse_min_spread=2.0", "collapse_restarts=1", resume))
    assert [(row["seed"], row["step"]) for row in results["restarts"]] == [(0, 3)]
    assert results["seed"] == 1 and results["global_step"] == 4


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["no_such_key=1"], ValueError, "no_such_key"),
        (["training.no_such_argument=1"], ValueError, "no_such_argument"),
        (["model.encoder_type=lstm"], StrictDataclassError, "encoder_type"),
        (["data=/nonexistent/corpus"], FileNotFoundError, "nonexistent"),
    ],
)
def test_bad_configuration_fails_before_training(tmp_path, overrides, error, message):
    with pytest.raises(error, match=message):
        train(tiny_config(tmp_path / "run", *overrides))
    assert not (run_folder(tmp_path / "run") / "checkpoints").exists()


def test_mismatched_and_empty_corpora(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.en").write_text("a\nb\n")
    (corpus / "train.de").write_text("a\n")
    with pytest.raises(ValueError, match="aligned"):
        train(tiny_config(tmp_path / "run", f"data={corpus}", "splits={train: train}"))
    (corpus / "train.de").write_text("")
    (corpus / "train.en").write_text("")
    with pytest.raises(ValueError, match="empty"):
        train(tiny_config(tmp_path / "run", f"data={corpus}", "splits={train: train}"))


@pytest.mark.parametrize("batching", [["training.per_device_train_batch_size=8"], ["max_tokens_per_batch=300"]],
                         ids=["sentences", "tokens"])
def test_two_cpu_processes_with_accelerate(tmp_path, batching):
    """`accelerate launch` with the 2-CPU-process config: both ranks finish with identical parameters (with
    token-count batches, accelerate hands each process whole batches of different sizes)."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config_path("cpu_2proc")),
        "--main_process_port", "29561",
        str(REPO / "tests" / "scripts" / "train_and_digest.py"), str(TINY),
        f"data={DATA}", f"output_dir={tmp_path}", "training.max_steps=3", "training.eval_steps=1",
        "training.save_steps=1", *batching,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(rank["world_size"] == 2 and rank["global_step"] == 3 for rank in ranks)
    assert ranks[0]["digest"] == ranks[1]["digest"]
    AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    if batching == ["training.per_device_train_batch_size=8"]:
        # the two processes shared the test split's translation: the saved model gives the same, alone
        from mgsa_hf.tokenization_utils import read_lines
        from mgsa_hf.training.ownership import run_folder
        from mgsa_hf.training.run import translate_examples

        sources = list(read_lines(DATA / "test_2016_flickr.en.gz", 8))
        shared = (run_folder(tmp_path) / "test.hyp.de").read_text(encoding="utf-8").splitlines()
        assert shared == translate_examples(tmp_path, sources, truncation=True)


@pytest.mark.parametrize("use_cpu", [True, False], ids=["use_cpu", "without_use_cpu"])
def test_user_script_under_two_cpu_processes(tmp_path, use_cpu):
    """A user's script with `MgsaSeq2SeqTrainer` under `accelerate launch` with the 2-CPU-process config: with
    `use_cpu=True` the two processes train as one (world size 2, token batches, the pairs of both counted in
    `train_samples_per_second`); without it the Trainer would train two independent copies, each seeing world size
    1 (accelerate after 1.3), so the script stops with an error naming `use_cpu=True`, or (accelerate 1.3, which
    passes the config's CPU setting on) the processes join as one run."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config_path("cpu_2proc")), "--main_process_port", "29563",
        str(REPO / "tests" / "scripts" / "trainer_processes.py"), str(tmp_path), *(["--use-cpu"] if use_cpu else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ACCELERATE_USE_CPU", None)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    if use_cpu:
        assert result.returncode == 0, result.stderr[-4000:]
        ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        assert all(rank["world_size"] == 2 and rank["global_step"] == 2 for rank in ranks)
        # 2 steps of one 4-pair batch in each of the 2 processes: the 16 pairs, whatever the per-device batch size
        metrics = ranks[0]["metrics"]
        assert metrics["train_samples_per_second"] == pytest.approx(16 / metrics["train_runtime"], rel=2e-3)
    elif list(tmp_path.glob("rank*.json")):
        # accelerate releases that pass the config's CPU setting on to the processes (1.3) join them as one run (whose
        # processes, which cannot close their group there without hanging, may abort in torch's teardown after it)
        ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        assert all(rank["world_size"] == 2 for rank in ranks)
    else:  # later ones leave each process alone: stopped, never two copies trained without a word
        assert "The launcher started 2 processes, but the training arguments see one" in result.stderr
        assert "set `use_cpu=True`" in result.stderr
        assert not list(tmp_path.glob("rank*.json"))


def test_demo_runs_every_encoder_type():
    """`mgsa-hf demo` as a user runs it: every encoder type parses real sentences, saves, reloads and generates."""
    result = subprocess.run([sys.executable, "-m", "mgsa_hf.cli", "demo"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "saved, reloaded, generated 2 sentences" in line]
    assert [line.split(":")[0].strip() for line in lines] == [
        "transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]


def test_corpus_files_through_datasets_loaders(tmp_path):
    """Split files (plain and gzip) and JSONL files, both record layouts (blank lines skipped); a record without the
    language fields is named."""
    import gzip

    from mgsa_hf.training.data import load_parallel_corpus

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.en").write_text("A dog runs.\nTwo cats sleep.\n")
    with gzip.open(folder / "train.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("Ein Hund rennt.\nZwei Katzen schlafen.\n")
    (folder / "val.jsonl").write_text('{"translation": {"en": "Hello.", "de": "Hallo."}}\n\n'
                                      '{"translation": {"en": "Yes.", "de": "Ja."}}\n')
    corpus = load_parallel_corpus(folder, "en", "de", {"train": "train", "validation": "val"})
    assert corpus["train"]["translation"] == [{"en": "A dog runs.", "de": "Ein Hund rennt."},
                                             {"en": "Two cats sleep.", "de": "Zwei Katzen schlafen."}]
    assert corpus["validation"]["translation"][1] == {"en": "Yes.", "de": "Ja."}
    flat = tmp_path / "flat.jsonl"
    flat.write_text('{"en": "Hello.", "de": "Hallo."}\n{"en": "Bye.", "de": "Tschüss."}\n')
    assert load_parallel_corpus(flat, "en", "de", {"train": "train"})["train"].num_rows == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"en": "Hello.", "de": "Hallo."}\n{"en": "Bye."}\n')
    with pytest.raises(ValueError, match="record 2 has no 'en'/'de'"):
        load_parallel_corpus(bad, "en", "de", {"train": "train"})


def test_multi30k_from_the_hub_as_the_readme_says(tmp_path, monkeypatch):
    """The README's command for Multi30k from the Hub (where ../shared is missing): the dataset id reaches
    `load_dataset`, its `en`/`de` columns become the `translation` pairs, and the run trains and scores validation
    and test. The Hub cannot be reached here: `load_dataset` serves the first lines of the local Multi30k files in
    the Hub dataset's layout (splits train, validation, test; a column per language). A split it lacks is named, and
    a missing corpus folder points to the README."""
    import shlex

    import datasets

    import mgsa_hf.training.data
    from mgsa_hf.tokenization_utils import read_lines
    from mgsa_hf.training.data import load_parallel_corpus

    (command,) = [line for line in (REPO / "docs" / "getting-started.md").read_text().splitlines()
                  if line.startswith("mgsa-hf train data=bentrevett/multi30k")]
    overrides = shlex.split(command.split("#")[0])[2:]
    real_load_dataset, requested = mgsa_hf.training.data.load_dataset, []

    def load_dataset(path, *args, **kwargs):
        if path != "bentrevett/multi30k":
            return real_load_dataset(path, *args, **kwargs)
        requested.append(path)
        files = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
        return datasets.DatasetDict({
            split: datasets.Dataset.from_dict({lang: list(read_lines(DATA / f"{name}.{lang}.gz", 64))
                                               for lang in ("en", "de")})
            for split, name in files.items()})

    monkeypatch.setattr(mgsa_hf.training.data, "load_dataset", load_dataset)
    config = load_train_config(TINY, [*overrides, f"output_dir={tmp_path}", "training.max_steps=1"])
    corpus = load_parallel_corpus(config.data, "en", "de", config.splits)
    assert corpus["test"]["translation"][0] == {"en": next(read_lines(DATA / "test_2016_flickr.en.gz", 1)),
                                                "de": next(read_lines(DATA / "test_2016_flickr.de.gz", 1))}
    results, _ = train(config)
    assert requested == ["bentrevett/multi30k"] * 2
    assert {row["split"] for row in results["scores"]} == {"validation", "test"}
    with pytest.raises(ValueError, match=r"has no split\(s\) \['val'\]; it has \['test', 'train', 'validation'\]"):
        load_parallel_corpus("bentrevett/multi30k", "en", "de", {"train": "train", "validation": "val"})
    missing = "no-such-folder' does not exist .*Hub dataset id.*MGSA_HF_DATA.*getting-started.md#the-data"
    with pytest.raises(FileNotFoundError, match=missing):
        load_parallel_corpus(tmp_path / "no-such-folder", "en", "de", config.splits)


def test_installed_wheel_trains_with_a_data_path(tmp_path):
    """`pip install .` (a wheel, not the editable checkout): the package data (the named recipes and rows, the
    `accelerate launch` configs, the model card template) and the LICENSE are inside, `mgsa-hf accelerate-config`
    gives the installed configs' paths, and `mgsa-hf train` runs from a folder outside the repository with `data=`
    given."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("mgsa_hf-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    recipes = site / "mgsa_hf" / "training" / "recipes"
    assert {path.stem for path in recipes.glob("*.yaml")} >= {"default", "finetune", "tiny"}
    assert (site / "mgsa_hf" / "rows" / "rhe" / "dea_rhe.json").is_file()
    assert (site / "mgsa_hf" / "rows" / "rhe" / "README.md").is_file()
    assert "Apache License" in next(site.glob("mgsa_hf-*.dist-info/licenses/LICENSE")).read_text()
    assert (site / "mgsa_hf" / "training" / "model_card_template.md").is_file()
    configs = site / "mgsa_hf" / "training" / "accelerate_configs"
    assert sorted(path.name for path in configs.iterdir()) == sorted(
        path.name for path in accelerate_config_path("cpu_2proc").parent.iterdir())
    assert (configs / "README.md").is_file() and len(list(configs.glob("*.yaml"))) == 5
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import mgsa_hf.cli; mgsa_hf.cli.main(['accelerate-config', 'cpu_2proc'])"
    printed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120, check=True).stdout.strip()
    assert printed == str(configs.resolve() / "cpu_2proc.yaml")
    overrides = [f"data={DATA}", f"output_dir={tmp_path / 'run'}", "max_train_samples=64", "max_eval_samples=8",
                 "max_test_samples=8", "vocab_size=300", "model.d_model=32", "model.encoder_layers=1",
                 "model.decoder_layers=1", "model.encoder_ffn_dim=64", "model.decoder_ffn_dim=64",
                 "training.max_steps=2", "training.per_device_train_batch_size=16", "training.save_steps=2",
                 "training.generation_max_length=8", "training.disable_tqdm=true", "examples=[]"]
    code = ("import sys, mgsa_hf, mgsa_hf.cli; print('FROM', mgsa_hf.__file__, flush=True); "
            "mgsa_hf.cli.main(['train', *sys.argv[1:]])")
    result = subprocess.run([sys.executable, "-c", code, *overrides], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"FROM {site}" in result.stdout
    assert json.loads((run_folder(tmp_path / "run") / "results.json").read_text())["global_step"] == 2


# Hand-written PTB trees (Penn Treebank conventions, function tags included) of Multi30k sentences: train 0, 1, 4 and
# val 0. Each groups the words differently from the tree the processor derives from spaCy's dependency parse.
GOLD_TREES = {
    ("train", 0): "(S (NP-SBJ (CD Two) (ADJP (JJ young) (, ,) (JJ White)) (NNS males)) (VP (VBP are) (ADVP-LOC "
                  "(RB outside) (PP (IN near) (NP (JJ many) (NNS bushes))))) (. .))",
    ("train", 1): "(S (NP-SBJ (NP (JJ Several) (NNS men)) (PP (IN in) (NP (JJ hard) (NNS hats)))) (VP (VBP are) (VP "
                  "(VBG operating) (NP (DT a) (JJ giant) (NN pulley) (NN system)))) (. .))",
    ("train", 4): "(S (NP-SBJ (CD Two) (NNS men)) (VP (VBP are) (PP-LOC-PRD (IN at) (NP (DT the) (NN stove))) (S-ADV "
                  "(VP (VBG preparing) (NP (NN food))))) (. .))",
    ("val", 0): "(S (NP-SBJ (NP (DT A) (NN group)) (PP (IN of) (NP (NNS men)))) (VP (VBP are) (VP (VBG loading) (NP "
                "(NN cotton)) (PP-CLR (IN onto) (NP (DT a) (NN truck))))))",
}
SYNTAX_FIELDS = ("word_ids", "head_word_ids", "phrase_ids", "phrase_tags", "pr_phrase_ids", "local_phrase_start",
                 "local_phrase_end", "tree_depth")


def multi30k_slice(folder: Path, sizes: dict[str, int]) -> dict[str, list[str]]:
    """A corpus folder of the first `sizes[split]` sentence pairs of Multi30k's splits; returns the sources."""
    from mgsa_hf.tokenization_utils import read_lines

    folder.mkdir(parents=True, exist_ok=True)
    sources = {}
    for split, size in sizes.items():
        for lang in ("en", "de"):
            lines = list(read_lines(DATA / f"{split}.{lang}.gz", size))
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
            sources.setdefault(split, lines)
    return sources


def write_tree_file(path: Path, split: str, size: int) -> list[str | None]:
    """The gold trees of `split` at their lines, empty lines elsewhere; returns the trees per line."""
    trees = [GOLD_TREES.get((split, line)) for line in range(size)]
    path.write_text("\n".join(tree or "" for tree in trees) + "\n", encoding="utf-8")
    return trees


def test_training_reads_tree_files(tmp_path):
    """`trees.<split>=file` through the config: the fields the model trains and is scored on come from the gold trees
    on their lines (as `processor(text, trees=tree)` makes them) and from the derived trees on empty lines."""
    from transformers import TrainerCallback

    from mgsa_hf.training.run import _training_arguments, prepare

    sources = multi30k_slice(tmp_path / "corpus", {"train": 32, "val": 8, "test_2016_flickr": 8})
    trees = {"train": write_tree_file(tmp_path / "train.ptb", "train", 32),
             "validation": write_tree_file(tmp_path / "val.ptb", "val", 8)}

    class TrainData(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            self.dataset = train_dataloader.dataset

    trained = TrainData()
    config = tiny_config(tmp_path / "run", f"data={tmp_path / 'corpus'}", "model.encoder_type=phrase_memory",
                         "training.max_steps=2", "training.eval_strategy=no", f"trees.train={tmp_path / 'train.ptb'}",
                         f"trees.validation={tmp_path / 'val.ptb'}")
    results, _ = train(config, callbacks=[trained])
    assert results["global_step"] == 2 and {row["split"] for row in results["scores"]} == {"validation", "test"}

    processor = MgsaProcessor.from_pretrained(tmp_path / "run")
    card = (tmp_path / "run" / "README.md").read_text()
    assert "conversion learned from Penn Treebank trees" in card and "given trees where the training data had" in card
    assert (tmp_path / "run" / "constituency_conversion.json.gz").is_file()
    _, _, processed = prepare(config, _training_arguments(config))
    assert trained.dataset[:] == processed["train"][:]
    # the training split cut at max_source_length, the scored ones at the model's positions only (tiny.yaml: 64)
    options, scored = dict(max_length=32, truncation=True), dict(max_length=64, truncation=True)
    differ_from_derived = []
    for split, corpus_split in (("train", "train"), ("validation", "val")):
        options = options if split == "train" else scored
        for i, (source, tree) in enumerate(zip(sources[corpus_split], trees[split], strict=True)):
            row = processed[split][i]
            expected, derived = processor(source, trees=tree, **options), processor(source, **options)
            # MG-SA's fields alone are stored: its phrases and the tags its loss reads
            assert [name for name in SYNTAX_FIELDS if name in row] == ["phrase_ids", "phrase_tags"]
            assert {name: row[name] for name in ("phrase_ids", "phrase_tags")} == \
                {name: expected[name] for name in ("phrase_ids", "phrase_tags")}
            if tree is not None:
                differ_from_derived.append(row["phrase_ids"] != derived["phrase_ids"]
                                           or row["phrase_tags"] != derived["phrase_tags"])
    # the derived trees of train lines 1 and the validation line equal these gold trees; lines 0 and 4 do not
    assert differ_from_derived == [True, False, True, False]
    assert processed["test"][0]["phrase_ids"] == processor(sources["test_2016_flickr"][0], **options)["phrase_ids"]


def test_bad_tree_files_fail_before_training(tmp_path):
    multi30k_slice(tmp_path / "corpus", {"train": 32, "val": 8, "test_2016_flickr": 8})
    write_tree_file(tmp_path / "train.ptb", "train", 32)
    write_tree_file(tmp_path / "short.ptb", "train", 31)
    lines = (tmp_path / "train.ptb").read_text().split("\n")
    lines[4] = lines[4].replace("(NN food)", "(NN soup)")
    (tmp_path / "wrong.ptb").write_text("\n".join(lines))
    corpus = f"data={tmp_path / 'corpus'}"
    for overrides, message in [
        ([f"trees.train={tmp_path / 'short.ptb'}"], r"short.ptb has 31 lines but split 'train' has 32 source"),
        ([f"trees.train={tmp_path / 'wrong.ptb'}"], r"wrong.ptb, line 5 .*Tree leaf 7 \('soup'\) does not match"),
        ([f"trees.dev={tmp_path / 'train.ptb'}"], r"split\(s\) \['dev'\]"),
        ([f"trees.train={tmp_path / 'missing.ptb'}"], r"missing.ptb for split 'train' does not exist"),
        (["tree_column=tree"], r"tree_column='tree'.*give its trees as a tree file"),
    ]:
        error = FileNotFoundError if "missing" in message else ValueError
        with pytest.raises(error, match=message):
            train(tiny_config(tmp_path / "run", corpus, "model.encoder_type=rhe", *overrides))
        assert not (run_folder(tmp_path / "run") / "checkpoints").exists()


def test_jsonl_tree_column(tmp_path):
    """`tree_column` names a field of JSONL records: its trees (null or "" for none) come with the corpus, checked."""
    from mgsa_hf.training.data import TREE_COLUMN, load_parallel_corpus

    records = [{"en": "Two men are at the stove preparing food.", "de": "Zwei Männer kochen.",
                "tree": GOLD_TREES[("train", 4)]},
               {"en": "A dog runs.", "de": "Ein Hund rennt.", "tree": ""},
               {"en": "A cat sleeps.", "de": "Eine Katze schläft."}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(record) for record in records) + "\n")
    corpus = load_parallel_corpus(tmp_path / "train.jsonl", "en", "de", {"train": "train"}, tree_column="tree")
    assert corpus["train"][TREE_COLUMN] == [GOLD_TREES[("train", 4)], None, None]
    records[1]["tree"] = "(S (NP (DT A) (NN dog)))"
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(record) for record in records) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl: the 'tree' tree of record 2 .*left over after the last leaf"):
        load_parallel_corpus(tmp_path / "train.jsonl", "en", "de", {"train": "train"}, tree_column="tree")


def test_scored_splits_come_back_in_corpus_order(multi30k_processor, tiny_config):
    """`_score_split` decodes longest first and, shared by processes, every n-th sentence each; the translations come
    back in corpus order: each equals that sentence's own greedy translation (a random model, whose outputs differ)."""
    from types import SimpleNamespace

    from datasets import Dataset, DatasetDict

    from mgsa_hf import MgsaDataCollator, MgsaForConditionalGeneration
    from mgsa_hf.training.run import _score_split

    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", init_std=0.5)).eval()
    model.generation_config.update(num_beams=1, max_new_tokens=6)
    sources = ["A dog runs.", "Two men in blue shirts play chess in a park near the river.", "A woman sings.",
               "Children are playing outside on a sunny day with their parents.", "A cat."]
    processed = DatasetDict({"test": Dataset.from_dict(dict(multi30k_processor(sources, text_target=sources)))})
    corpus = DatasetDict({"test": Dataset.from_dict({"translation": [{"en": s, "de": s} for s in sources]})})
    config = SimpleNamespace(target_lang="de", source_lang="en", backbone="marian",
                             model={"max_position_embeddings": 512}, init_from=None, max_source_length=128,
                             max_target_length=128)
    trainer = SimpleNamespace(model=model, data_collator=MgsaDataCollator(tokenizer=multi30k_processor.tokenizer),
                              args=SimpleNamespace(per_device_eval_batch_size=2, process_index=0, world_size=1))
    row = _score_split(trainer, processed, corpus, "test", config, multi30k_processor.tokenizer)
    alone = [multi30k_processor.batch_decode(model.generate(**multi30k_processor([source], return_tensors="pt")),
                                             skip_special_tokens=True)[0] for source in sources]
    assert row["predictions"] == alone and len(set(alone)) > 1
