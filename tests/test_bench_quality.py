"""mgsa_hf.benchmarking.quality (scripts/bench_quality.py) and mgsa_hf.training.prepared: the paired bootstrap test
against sacreBLEU's, the BENCHMARKS.md section update, and the whole benchmark path on real Multi30k sentences with
the dry-run budget (prepare with spaCy → train in parallel processes → resume → average → beam search → report),
including a run in a process where spaCy and `datasets` cannot be imported, as on a GPU machine."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from mgsa_hf.benchmarking import quality as bench_quality
from mgsa_hf.benchmarking.quality_report import with_seed_tests
from mgsa_hf.benchmarking.rows import resolve_rows
from mgsa_hf.evaluation import paired_bootstrap
from mgsa_hf.tokenization_utils import read_lines


# the benchmark tools' own tests: not in the default run (setup.cfg), CI runs them with `-m benchmark_tools`
pytestmark = pytest.mark.benchmark_tools
REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR



@pytest.fixture(scope="module")
def references():
    return list(read_lines(DATA / "test_2016_flickr.de.gz", 300))


def degrade(sentences, rate, seed):
    """Each word dropped with probability `rate`: a system whose quality falls as `rate` grows."""
    rng = random.Random(seed)
    return [" ".join(w for w in s.split() if rng.random() >= rate) for s in sentences]


@pytest.mark.parametrize("metric", [BLEU(), CHRF()], ids=["bleu", "chrf"])
def test_one_seed_is_sacrebleu_paired_bootstrap(references, metric):
    baseline, system = degrade(references, 0.30, 0), degrade(references, 0.25, 1)
    ours = paired_bootstrap([baseline], [system], references, metric)
    _, scores = PairedTest([("baseline", baseline), ("system", system)], {"m": metric}, [references],
                           test_type="bs", n_samples=1000)()
    name = next(key for key in scores if key != "System")
    expected = scores[name][1]
    assert ours["system"] == pytest.approx(expected.score, abs=0.01)
    assert ours["p_value"] == pytest.approx(expected.p_value, abs=1e-4)
    assert ours["delta"] == pytest.approx(expected.score - scores[name][0].score, abs=0.01)


class PublicOnly:
    """A sacreBLEU metric seen through its public `corpus_score` alone."""

    def __init__(self, metric):
        self.corpus_score = metric.corpus_score


@pytest.mark.parametrize("metric", [BLEU(), CHRF()], ids=["bleu", "chrf"])
def test_public_corpus_score_gives_the_same_test(references, metric):
    """Without sacreBLEU's per-sentence statistics methods the test scores every resample with `corpus_score`, and
    gets the same result."""
    baseline, system = degrade(references[:100], 0.30, 0), degrade(references[:100], 0.25, 1)
    fast = paired_bootstrap([baseline], [system], references[:100], metric, n_samples=50)
    public = paired_bootstrap([baseline], [system], references[:100], PublicOnly(metric), n_samples=50)
    assert fast == public


def test_identical_systems_are_not_different(references):
    system = degrade(references, 0.3, 0)
    result = paired_bootstrap([system], [list(system)], references, BLEU())
    assert result["delta"] == 0.0 and result["p_value"] == 1.0
    assert result["delta_95ci"] == [0.0, 0.0]


def test_clearly_better_and_worse_systems_are_significant(references):
    baseline = degrade(references, 0.3, 0)
    better = paired_bootstrap([baseline], [degrade(references, 0.1, 1)], references, BLEU())
    worse = paired_bootstrap([baseline], [degrade(references, 0.5, 2)], references, BLEU())
    assert better["delta"] > 5 and better["p_value"] < 0.05 and better["delta_95ci"][0] > 0
    assert worse["delta"] < -5 and worse["p_value"] < 0.05 and worse["delta_95ci"][1] < 0
    # two systems of the same quality, differing only by chance: no significant difference
    same = paired_bootstrap([baseline], [degrade(references, 0.3, 3)], references, BLEU())
    assert same["p_value"] > 0.05 and same["delta_95ci"][0] < 0 < same["delta_95ci"][1]


def test_seeds_are_averaged(references):
    seeds = [degrade(references, rate, seed) for seed, rate in enumerate((0.2, 0.4))]
    baseline = [degrade(references, 0.3, 5), degrade(references, 0.3, 6)]
    result = paired_bootstrap(baseline, seeds, references, BLEU())
    mean = sum(BLEU().corpus_score(s, [references]).score for s in seeds) / 2
    assert result["system"] == pytest.approx(mean, abs=0.01)
    with pytest.raises(ValueError, match="same number"):
        paired_bootstrap(baseline, seeds[:1], references, BLEU())
    with pytest.raises(ValueError, match="hypotheses for"):
        paired_bootstrap([references[:10]], [references[:10]], references, BLEU())


def test_markdown_section_is_replaced_and_others_kept():
    text = "# Benchmarks\n\n## Speed\n\nspeed table\n\n## Translation quality\n\nold\n\n## Preprocessing\n\nparse\n"
    updated = bench_quality.replace_section(text, "## Translation quality\n\nnew table\n")
    assert "old" not in updated and "new table" in updated
    assert updated.index("## Speed") < updated.index("new table") < updated.index("## Preprocessing")
    assert "speed table" in updated and "parse" in updated
    assert bench_quality.replace_section(updated, "## Translation quality\n\nnew table\n") == updated
    appended = bench_quality.replace_section("# Benchmarks\n\n## Speed\n\nx\n", "## Translation quality\n\ny\n")
    assert appended.endswith("## Translation quality\n\ny\n") and "## Speed\n\nx" in appended


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry-run budget end to end: `all` with two rows, one seed, two processes at once."""
    root = tmp_path_factory.mktemp("bench")
    args = ["all", "--budget", "dry-run", "--root", str(root), "--data", str(DATA), "--rows", "hybrid", "rhe",
            "--seeds", "1", "--jobs", "2", "--threads", "1", "--results", str(root / "quality.json"),
            "--markdown", str(root / "BENCHMARKS.md")]
    return root, args, bench_quality.main(args)


def test_prepared_corpus_holds_every_field(dry_run):
    from mgsa_hf.training.prepared import PreparedCorpus

    root, _, _ = dry_run
    corpus = PreparedCorpus(root / "dry-run" / "prepared")
    assert corpus.manifest["splits"] == {"train": 64, "validation": 64, "test": 64}
    batch = corpus.split("train").batch([0, 5, 9])
    for name in ("input_ids", "attention_mask", "labels", "word_ids", "head_word_ids", "phrase_ids", "phrase_tags",
                 "pr_phrase_ids", "local_phrase_start", "local_phrase_end", "tree_depth"):
        assert name in batch and batch[name].shape[0] == 3
    assert batch["phrase_ids"].shape[1] == corpus.manifest["phrase_levels"]
    # the same fields as the processor makes for these sentences, padded as the collator pads them
    from mgsa_hf import MgsaProcessor

    processor = MgsaProcessor.from_pretrained(root / "dry-run" / "prepared" / "processor")
    sources = (root / "dry-run" / "prepared" / "train.en").read_text().splitlines()
    expected = processor([sources[i] for i in (0, 5, 9)], max_length=32, truncation=True, return_tensors="pt")
    for name, tensor in expected.items():
        assert batch[name].tolist() == tensor.tolist(), name


def test_dry_run_reports_every_run(dry_run):
    root, _, report = dry_run
    assert set(report["summary"]) == {"transformer", "hybrid", "rhe"}
    assert len(report["runs"]) == 3
    for run in report["runs"]:
        assert run["seed"] == 1 and run["steps"] == 6 and run["encoder_type"] in report["summary"]
        assert set(run["test"]) >= {"bleu", "chrf", "distinct_fraction"}
        assert 0 < run["test"]["distinct_fraction"] <= 1 and run["averaged_checkpoints"] == ["step-3", "step-6"]
    assert "nrefs:1|case:mixed" in report["signatures"]["bleu"] and "tok:13a" in report["signatures"]["bleu"]
    assert set(report["significance"]) == {"hybrid", "rhe"}
    saved = json.loads((root / "quality.json").read_text())
    assert saved["summary"] == report["summary"] and saved["command"].startswith("python scripts/bench_quality.py")
    # the command that trained the runs, kept with them and shown under the table; the p-values adjusted over the rows
    assert [{k: v for k, v in entry.items() if k != "commit"} for entry in saved["trained_by"]] == [
        {"command": saved["command"], "runs": {"transformer": [1], "hybrid": [1], "rhe": [1]}}]
    assert set(saved["holm"]["bleu"]) == {"hybrid", "rhe"}
    markdown = (root / "BENCHMARKS.md").read_text()
    assert "## Translation quality" in markdown and "| `hybrid` | 1 | 6 |" in markdown
    assert f"Runs trained by `{saved['command']}`" in markdown
    assert (root / "quality" / "rhe.seed-1.test.hyp.de").is_file()


def test_finished_runs_are_not_trained_again(dry_run, capsys):
    root, args, _ = dry_run
    stamp = (root / "dry-run" / "hybrid" / "seed-1" / "result.json").stat().st_mtime_ns
    capsys.readouterr()
    bench_quality.main(["train", *args[1:]])
    assert "finished already" in capsys.readouterr().out
    assert (root / "dry-run" / "hybrid" / "seed-1" / "result.json").stat().st_mtime_ns == stamp


def test_kept_runs_are_not_trained_again_in_a_fresh_root(dry_run, tmp_path, capsys):
    """Every finished run is kept beside the results (`<results>.runs/<row>/seed-<seed>/`, whole or absent), with the
    corpus's tokenizer. A fresh root (another checkout) prepares the same corpus with that tokenizer, trains only the
    runs not kept, and reports the kept ones as they were; a kept run of another recipe is refused, not mixed in."""
    root, args, report = dry_run
    kept = root / "quality.runs"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.glob("*/seed-*")) == [
        "hybrid/seed-1", "rhe/seed-1", "transformer/seed-1"]
    assert not list(kept.glob("**/.*")) and (kept / "tokenizer" / "tokenizer.json").is_file()  # nothing partial
    # another checkout: no prepared corpus, the kept runs without rhe's
    fresh, results = tmp_path / "runs", tmp_path / "quality.json"
    shutil.copytree(kept, tmp_path / "quality.runs", ignore=shutil.ignore_patterns("rhe"))
    again = ["all", "--budget", "dry-run", "--root", str(fresh), "--data", str(DATA), "--rows", "hybrid", "rhe",
             "--seeds", "1", "--jobs", "2", "--threads", "1", "--results", str(results),
             "--markdown", str(tmp_path / "BENCHMARKS.md")]
    capsys.readouterr()
    second = bench_quality.main(again)
    out = capsys.readouterr().out
    assert "preparing with the tokenizer of the kept runs" in out
    manifests = [json.loads((folder / "dry-run" / "prepared" / "manifest.json").read_text())
                 for folder in (root, fresh)]
    assert manifests[0]["fingerprint"] == manifests[1]["fingerprint"]  # the same prepared tensors
    assert out.count("restored the finished run") == 2 and out.count("[bench_quality] start ") == 1
    assert "start dry-run: rhe seed 1" in out
    first = {(r["name"], r["seed"]): r for r in report["runs"]}
    for run in second["runs"]:
        if run["name"] != "rhe":
            assert run == first[(run["name"], run["seed"])]
    assert (tmp_path / "quality.runs" / "rhe" / "seed-1" / "result.json").is_file()
    # a kept run of another learning rate does not stand in for this budget's run
    shutil.rmtree(fresh / "dry-run" / "hybrid")
    record = tmp_path / "quality.runs" / "hybrid" / "seed-1" / "run.json"
    trained = json.loads(record.read_text())
    trained["recipe"]["learning_rate"] *= 2
    record.write_text(json.dumps(trained))
    with pytest.raises(SystemExit, match="a run of another recipe"):
        bench_quality.main(["train", *again[1:]])


def test_mgsa_default_row_is_the_final_system_and_other_runs_are_refused(tmp_path):
    """The `phrase_memory` row of `defaults` is MG-SA's final system (the default config, fields written out); a run
    folder under that name holding another row (the n-gram row, once the default) is refused, not reused."""
    from mgsa_hf import MgsaConfig

    fields = resolve_rows(["defaults"])["phrase_memory"]
    config = MgsaConfig(**fields)
    assert MgsaConfig(encoder_type="phrase_memory").to_diff_dict() == config.to_diff_dict()
    assert (config.phrase_partition, config.phrase_tag_supervision, config.phrase_interaction) == (
        "syntactic", True, "on_lstm")
    args = bench_quality.parse_args(["train", "--budget", "dry-run", "--root", str(tmp_path), "--rows",
                                     "phrase_memory"])
    name, budget = bench_quality.load_budget("dry-run")
    run_dir = tmp_path / name / "phrase_memory" / "seed-1"
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"row": {"encoder_type": "phrase_memory"}}))
    with pytest.raises(SystemExit, match=f"{run_dir} holds a run of .*not of row 'phrase_memory'"):
        bench_quality.pending_runs(args, name, budget)
    (run_dir / "result.json").write_text(json.dumps({"row": fields}))
    assert [label for label, _, _ in bench_quality.pending_runs(args, name, budget)] == [
        f"{name}: transformer seed 1"]


def test_resumed_run_equals_uninterrupted(dry_run, tmp_path):
    """Stopped after its step-3 checkpoint and started again, a run ends with the weights and the logged losses of
    an uninterrupted one (CPU, one thread)."""
    from safetensors.torch import load_file

    from mgsa_hf.training.prepared import PreparedCorpus, train_run

    root, _, _ = dry_run
    corpus = PreparedCorpus(root / "dry-run" / "prepared")
    _, budget = bench_quality.load_budget("dry-run")
    row = {"encoder_type": "phrase_memory"}
    recipe = bench_quality.recipe_of(budget, None)
    recipe.eval_bleu_samples, recipe.average_last = 0, 1
    train_run(corpus, tmp_path / "whole", recipe, row, seed=3, device="cpu", threads=1)
    first_half = bench_quality.recipe_of(budget, 3)
    first_half.eval_bleu_samples, first_half.average_last = 0, 1
    train_run(corpus, tmp_path / "resumed", first_half, row, seed=3, device="cpu", threads=1)
    (tmp_path / "resumed" / "result.json").unlink()  # as if it had been cut off after its checkpoint
    train_run(corpus, tmp_path / "resumed", recipe, row, seed=3, device="cpu", threads=1)
    whole = load_file(tmp_path / "whole" / "checkpoints" / "step-6.safetensors")
    resumed = load_file(tmp_path / "resumed" / "checkpoints" / "step-6.safetensors")
    for name, tensor in whole.items():
        assert torch.allclose(tensor, resumed[name], atol=1e-6), name

    def losses(run):
        return [(e["step"], e["validation_loss"]) for e in map(json.loads, (tmp_path / run / "log.jsonl").open())
                if "validation_loss" in e]

    assert losses("whole") == losses("resumed")


def test_a_run_resumed_on_another_machine_lists_both_and_the_report_says_so(dry_run, tmp_path, monkeypatch):
    """Steps/s are only comparable on one machine: each run records where it trained, and a report whose runs
    trained on several machines says that its steps/s ratios mix them."""
    import copy

    from mgsa_hf.training import prepared as prepared_training

    root, _, report = dry_run
    here = prepared_training.host_description(torch.device("cpu"))
    assert all(run["hosts"] == [here] for run in report["runs"])
    assert "trained on" not in bench_quality.render_budget(copy.deepcopy(report))
    corpus = prepared_training.PreparedCorpus(root / "dry-run" / "prepared")
    _, budget = bench_quality.load_budget("dry-run")
    row = {"encoder_type": "transformer"}
    prepared_training.train_run(corpus, tmp_path / "run", bench_quality.recipe_of(budget, 3), row, seed=1,
                                device="cpu", threads=1)
    (tmp_path / "run" / "result.json").unlink()  # cut off after its step-3 checkpoint, resumed elsewhere
    monkeypatch.setattr(prepared_training, "host_description", lambda device: "another machine")
    result = prepared_training.train_run(corpus, tmp_path / "run", bench_quality.recipe_of(budget, None), row,
                                         seed=1, device="cpu", threads=1)
    assert result["hosts"] == [here, "another machine"] and result["steps"] == 6
    mixed = copy.deepcopy(report)
    mixed["summary"]["transformer"]["hosts"] = result["hosts"]
    assert "these runs trained on 2 machines" in bench_quality.render_budget(mixed)


def test_training_runs_without_spacy_or_datasets(dry_run, tmp_path):
    """The train step needs torch, transformers and sacreBLEU only: a run in a process where spaCy and `datasets`
    cannot be imported. It keeps the run of a row named by a path (`<row>/<reading>`) at
    `<kept runs>/<row>/<reading>/seed-<seed>`, and the corpus's tokenizer once, at `<kept runs>/tokenizer`."""
    root, _, _ = dry_run
    kept = tmp_path / "quality.runs"
    code = (
        "import sys\n"
        "import runpy\n"
        "for name in ('spacy', 'datasets'): sys.modules[name] = None\n"
        f"sys.argv = ['bench_quality.py', 'run-one', '--budget', 'dry-run', '--prepared', "
        f"{str(root / 'dry-run' / 'prepared')!r}, '--row-json', '{{\"encoder_type\": \"rhe\"}}', "
        f"'--run-dir', {str(tmp_path / 'run')!r}, '--seeds', '2', '--threads', '1', "
        f"'--keep-run', {str(kept / 'rhe' / 'dea_rhe' / 'seed-2')!r}, '--kept-runs', {str(kept)!r}]\n"
        f"runpy.run_path({str(REPO / 'scripts' / 'bench_quality.py')!r}, run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["encoder_type"] == "rhe" and result["steps"] == 6 and len(result["averaged_checkpoints"]) == 2
    kept_result = kept / "rhe" / "dea_rhe" / "seed-2" / "result.json"
    assert kept_result.read_text() == (tmp_path / "run" / "result.json").read_text()
    assert [path.relative_to(kept).as_posix() for path in kept.rglob("tokenizer")] == ["tokenizer"]


def test_runs_cut_short_finish_at_their_common_step(dry_run, tmp_path):
    """Runs stopped at different steps (a GPU lease ending) are all scored at the last checkpoint step every one of
    them reached, each with the checkpoints up to that step averaged."""

    root, _, _ = dry_run
    prepared = root / "dry-run" / "prepared"
    budget = json.loads((REPO / "configs" / "quality" / "dry-run.json").read_text())
    budget["recipe"].update(keep_checkpoints=10, save_every=2, average_last=2)
    budget_file = tmp_path / "cut.json"
    budget_file.write_text(json.dumps(budget))
    common = ["--budget", str(budget_file), "--root", str(tmp_path / "runs"), "--prepared", str(prepared),
              "--rows", "hybrid", "--seeds", "1", "--jobs", "2", "--threads", "1",
              "--results", str(tmp_path / "quality-cut.json")]
    bench_quality.main(["train", *common])
    runs = tmp_path / "runs" / "cut"
    shutil.rmtree(tmp_path / "quality-cut.runs")  # runs cut short never finished: none of them was kept
    for run in ("transformer", "hybrid"):
        (runs / run / "seed-1" / "result.json").unlink()
    for step in (4, 6):  # hybrid "was stopped" after its step-2 checkpoint, before its first logged step
        (runs / "hybrid" / "seed-1" / "checkpoints" / f"step-{step}.safetensors").unlink()
    (runs / "hybrid" / "seed-1" / "log.jsonl").unlink()
    shutil.copyfile(runs / "transformer" / "seed-1" / "checkpoints" / "step-6.safetensors",
                    runs / "transformer" / "seed-1" / "checkpoints" / "step-8.safetensors")
    assert bench_quality.common_step([runs / "transformer" / "seed-1", runs / "hybrid" / "seed-1"]) == 2
    bench_quality.main(["train", *common, "--at-common-step"])
    for run in ("transformer", "hybrid"):
        result = json.loads((runs / run / "seed-1" / "result.json").read_text())
        assert result["steps"] == 2 and result["averaged_checkpoints"] == ["step-2"]
        assert (tmp_path / "quality-cut.runs" / run / "seed-1" / "result.json").is_file()  # kept, log or none


def test_prepare_reads_tree_files(tmp_path):
    """`prepare --train-trees FILE`: the prepared fields of a sentence with a tree line are those the processor makes
    from that tree, the others the derived ones; the manifest records the file, and a prepared corpus made with other
    trees is not reused."""
    import tree_plugins

    from mgsa_hf import MgsaProcessor
    from mgsa_hf.training.prepared import PreparedCorpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, size in (("train", 24), ("val", 4), ("test_2016_flickr", 4)):
        for lang in ("en", "de"):
            lines = list(read_lines(DATA / f"{split}.{lang}.gz", size))
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    sources = (corpus / "train.en").read_text().splitlines()
    trees = [tree_plugins.flat_np_tree(source) if i in (1, 4) else None for i, source in enumerate(sources)]
    (tmp_path / "train.ptb").write_text("\n".join(tree or "" for tree in trees) + "\n")
    common = ["--budget", "dry-run", "--root", str(tmp_path / "runs"), "--data", str(corpus)]
    bench_quality.main(["prepare", *common, "--train-trees", str(tmp_path / "train.ptb")])
    folder = tmp_path / "runs" / "dry-run" / "prepared"
    prepared = PreparedCorpus(folder)
    assert prepared.manifest["trees"] == {"train": str(tmp_path / "train.ptb")}
    assert prepared.manifest["derived_trees"].startswith("learned conversion ")
    processor = MgsaProcessor.from_pretrained(folder / "processor")
    batch = prepared.split("train").batch([0, 1, 4])
    expected = processor([sources[i] for i in (0, 1, 4)], trees=[trees[i] for i in (0, 1, 4)], max_length=32,
                         truncation=True, return_tensors="pt")
    derived = processor([sources[i] for i in (0, 1, 4)], max_length=32, truncation=True, return_tensors="pt")
    for name, tensor in expected.items():
        assert batch[name].tolist() == tensor.tolist(), name
    assert batch["phrase_ids"][1].tolist() != derived["phrase_ids"][1].tolist()
    with pytest.raises(SystemExit, match="was prepared with"):
        bench_quality.main(["prepare", *common])
    # the same tree files, but the derived trees of another conversion: stale
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "derived_trees": "learned conversion 0123"}))
    with pytest.raises(SystemExit, match="learned conversion 0123"):
        bench_quality.main(["prepare", *common, "--train-trees", str(tmp_path / "train.ptb")])


def test_sublayer_probe_trains_and_measures_every_attention_sublayer(dry_run, tmp_path):
    """scripts/probe_sublayers.py on the prepared corpus: the budget's training steps with a loss curve and, per
    attention sub-layer, the RMS of its output over its input's (PR's phrase combination included)."""
    root, _, _ = dry_run
    output = tmp_path / "probe.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "probe_sublayers.py"), "--budget", "dry-run", "--prepared",
                    str(root / "dry-run" / "prepared"), "--rows", "phrase_representation",
                    "phrase_representation/max_attn_ta_uncentred", "--steps", "4",
                    "--every", "2", "--jobs", "2", "--threads", "1", "--output", str(output)],
                   check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(output.read_text())
    uncentred = "phrase_representation/max_attn_ta_uncentred"
    assert set(report["rows"]) == {"transformer", "phrase_representation", uncentred}
    layers = json.loads((REPO / "configs" / "quality" / "dry-run.json").read_text())["recipe"]["model"]
    for label, result in report["rows"].items():
        assert [point["step"] for point in result["curve"]] == [2, 4]
        ratios = result["curve"][-1]["output_over_input_rms"]
        probed = [name for name in ratios if name.endswith("phrase_combination")]
        assert len(probed) == (0 if label == "transformer" else layers["encoder_layers"] + layers["decoder_layers"])
        assert len(ratios) - len(probed) == layers["encoder_layers"] + 2 * layers["decoder_layers"]
        assert all(value > 0 for value in ratios.values()) and result["curve"][0]["loss"] > 0


def test_rhe_head_rate_of_a_run_equals_the_processor_path(dry_run, tmp_path):
    """scripts/rhe_head_rate.py (`analysis.prepared_run_head_rate`) counts Eq. 10's labels of a trained run on the
    prepared batches: the same rates as `redundant_head_rate` finds through the processor on the same sentences, and a
    clear refusal for a non-RHE run."""

    from mgsa_hf import MgsaProcessor
    from mgsa_hf.evaluation.analysis import load_prepared_run, prepared_run_head_rate, redundant_head_rate
    from mgsa_hf.training.prepared import PreparedCorpus

    root, _, _ = dry_run
    prepared = root / "dry-run" / "prepared"
    corpus = PreparedCorpus(prepared)
    # after 6 steps σ(h_conf) labels every head redundant; a fixed gate (no weights of its own) mixes the labels, so
    # that the comparison can fail
    run = tmp_path / "rhe-fixed-gate"
    shutil.copytree(root / "dry-run" / "rhe" / "seed-1", run)
    manifest = json.loads((run / "run.json").read_text())
    manifest["row"]["rhe_fixed_gate"] = 0.3
    (run / "run.json").write_text(json.dumps(manifest))
    output = tmp_path / "rate.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "rhe_head_rate.py"), str(run), "--prepared", str(prepared),
                    "--batch-size", "16", "--output", str(output)], check=True, capture_output=True, text=True)
    results = json.loads(output.read_text())["runs"]
    rate = results[str(run)]
    assert rate["checkpoints"] == ["step-3", "step-6"] and rate["sentences"] == 64 and rate["layers"] == [0]
    rates = torch.tensor(rate["redundant"])
    assert 0.05 < rates.mean() < 0.95
    model, _ = load_prepared_run(run, corpus)
    processor = MgsaProcessor.from_pretrained(prepared / "processor")
    sources = (prepared / "test.en").read_text().splitlines()

    def truncating(texts, **kwargs):  # the prepared corpus is cut at the budget's max_length
        return processor(texts, max_length=corpus.manifest["max_length"], truncation=True, **kwargs)

    expected = redundant_head_rate(model, truncating, sources, batch_size=10)
    assert torch.allclose(rates, expected.rate, atol=1e-4)
    assert results == {str(run): prepared_run_head_rate(run, corpus, "test", 16)}
    with pytest.raises(SystemExit, match="not an RHE run"):
        prepared_run_head_rate(root / "dry-run" / "hybrid" / "seed-1", corpus, "test", 16)


def selection_record(name, seed, validation, test):
    return {"name": name, "seed": seed, "validation": {"bleu": validation, "chrf": 50.0},
            "test": {"bleu": test, "chrf": 50.0}}


def test_selection_picks_each_rows_best_validation_budget():
    """Every row, the transformer included, takes the budget of its higher mean validation BLEU over the seeds the
    budgets share (a seed only one budget ran does not count in the choice, and is tested when its budget is
    chosen); test scores play no part, and a tie keeps the first budget."""
    fast = [selection_record("transformer", 1, 30.0, 20.0), selection_record("transformer", 2, 32.0, 20.0),
            selection_record("transformer", 4, 10.0, 21.0),  # a seed only the chosen budget ran: tested, not chosen by
            selection_record("hybrid", 1, 31.0, 40.0), selection_record("hybrid", 2, 31.0, 40.0),
            selection_record("rhe", 1, 30.0, 30.0), selection_record("rhe", 2, 30.0, 30.0)]
    slow = [selection_record("transformer", 1, 30.5, 25.0), selection_record("transformer", 2, 31.0, 25.0),
            selection_record("transformer", 3, 99.0, 25.0),  # a seed `fast` has not run: not counted
            selection_record("hybrid", 1, 31.5, 10.0), selection_record("hybrid", 2, 31.0, 10.0),
            selection_record("rhe", 1, 29.0, 30.0), selection_record("rhe", 2, 31.0, 30.0),
            selection_record("phrase_memory", 1, 40.0, 40.0)]  # a row only one budget ran: left out
    runs, selection = bench_quality.select_runs({"fast": fast, "slow": slow}, "validation_bleu")
    assert {name: row["chosen"] for name, row in selection.items()} == {
        "transformer": "fast", "hybrid": "slow", "rhe": "fast"}
    assert selection["transformer"]["seeds"] == [1, 2]
    assert selection["transformer"]["scores"] == {"fast": {"validation": 31.0, "test": 20.0},
                                                  "slow": {"validation": 30.75, "test": 25.0}}
    assert sorted((r["name"], r["seed"], r["test"]["bleu"]) for r in runs) == [
        ("hybrid", 1, 10.0), ("hybrid", 2, 10.0), ("rhe", 1, 30.0), ("rhe", 2, 30.0),
        ("transformer", 1, 20.0), ("transformer", 2, 20.0), ("transformer", 4, 21.0)]
    with pytest.raises(SystemExit, match="transformer"):
        bench_quality.select_runs({"fast": fast[3:], "slow": slow}, "validation_bleu")


def test_selection_of_one_budget_reproduces_its_report(tmp_path):
    """A selection budget read from the committed `cpu-lr-0.005` results (their test translations and Multi30k's
    references) gives back that budget's summary and paired tests; with both learning rates it names what it chose
    for every row, as the committed `cpu` table does."""

    for source in ("cpu-lr-0.005", "cpu-lr-0.0025"):
        shutil.copyfile(REPO / "benchmarks" / f"quality-{source}.json", tmp_path / f"quality-{source}.json")
        shutil.copytree(REPO / "benchmarks" / f"quality-{source}", tmp_path / f"quality-{source}")
    # a report written before the t-test over seeds: the test computed from its runs' scores
    committed = with_seed_tests(json.loads((tmp_path / "quality-cpu-lr-0.005.json").read_text()))
    rows = ["transformer", "phrase_representation"]
    committed["runs"] = [r for r in committed["runs"] if r["name"] in rows]
    (tmp_path / "quality-cpu-lr-0.005.json").write_text(json.dumps(committed))
    budget = tmp_path / "cpu-only.json"
    budget.write_text(json.dumps({"select": {"from": ["cpu-lr-0.005"], "by": "validation_bleu"}}))
    common = ["--data", str(DATA), "--markdown", str(tmp_path / "BENCHMARKS.md")]
    report = bench_quality.main(["report", "--budget", str(budget), "--results", str(tmp_path / "one.json"),
                                 *common])
    assert report["summary"] == {name: committed["summary"][name] for name in rows}
    # the paired test, recomputed from the kept translations and the corpus' references, is the committed one
    assert report["significance"] == {"phrase_representation": committed["significance"]["phrase_representation"]}

    budget.write_text(json.dumps({"select": {"from": ["cpu-lr-0.005", "cpu-lr-0.0025"], "by": "validation_bleu"}}))
    both = bench_quality.main(["report", "--budget", str(budget), "--results", str(tmp_path / "two.json"), *common])
    table = json.loads((REPO / "benchmarks" / "quality-cpu.json").read_text())
    assert set(both["selection"]) == set(rows)
    for name, row in both["selection"].items():
        better = max(row["scores"], key=lambda source: row["scores"][source]["validation"])
        assert row["chosen"] == better and row["recipe"] == {"learning_rate": {"cpu-lr-0.005": 0.005,
                                                                               "cpu-lr-0.0025": 0.0025}[better]}
        assert {r["budget"] for r in both["runs"] if r["name"] == name} == {better}
        assert row == table["selection"][name] and both["summary"][name] == table["summary"][name]
    assert "| chosen |" in (tmp_path / "BENCHMARKS.md").read_text()


def test_selection_budget_trains_both_budgets_and_chooses(dry_run, tmp_path, capsys):
    """`all` of a selection budget over the dry-run recipe at two learning rates: one prepared corpus for both, their
    runs in one queue, each budget reported beside the selection, every row from the budget of its better validation
    BLEU; a second `train` finds every run finished, and a selection of selections is refused."""
    budget = json.loads((REPO / "configs" / "quality" / "dry-run.json").read_text())
    budget["recipe"]["learning_rate"] = 0.01
    (tmp_path / "dry-run-fast.json").write_text(json.dumps(budget))
    selection = tmp_path / "dry-choice.json"
    selection.write_text(json.dumps({"select": {"from": ["dry-run", str(tmp_path / "dry-run-fast.json")]}}))
    args = ["--budget", str(selection), "--root", str(tmp_path / "runs"), "--data", str(DATA), "--rows", "hybrid",
            "--seeds", "1", "--jobs", "2", "--threads", "1", "--results", str(tmp_path / "quality-dry-choice.json"),
            "--markdown", str(tmp_path / "BENCHMARKS.md")]
    report = bench_quality.main(["all", *args])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["dry-choice", "dry-run", "dry-run-fast"]
    assert sorted(p.name for p in (tmp_path / "runs" / "dry-choice").iterdir()) == ["prepared"]
    sources = {name: json.loads((tmp_path / f"quality-{name}.json").read_text())
               for name in ("dry-run", "dry-run-fast")}
    for name, lr in (("dry-run", 0.001), ("dry-run-fast", 0.01)):
        assert {(r["name"], r["seed"]) for r in sources[name]["runs"]} == {("transformer", 1), ("hybrid", 1)}
        assert f"lr {lr} " in sources[name]["protocol"]
    for name, row in report["selection"].items():
        scores = {source: next(r["validation"]["bleu"] for r in sources[source]["runs"] if r["name"] == name)
                  for source in sources}
        assert row["chosen"] == max(scores, key=scores.get)  # max keeps the first of equals, as the selection does
        assert row["recipe"] == {"learning_rate": {"dry-run": 0.001, "dry-run-fast": 0.01}[row["chosen"]]}
        chosen_run = next(r for r in sources[row["chosen"]]["runs"] if r["name"] == name)
        assert [r["test"] for r in report["runs"] if r["name"] == name] == [chosen_run["test"]]
    assert set(report["significance"]) == {"hybrid"}
    assert sorted(report["sources"]) == ["dry-run", "dry-run-fast"]
    # the shared corpus holds the sentences the dry-run budget prepares on its own (the module's fixture)
    shared, own = tmp_path / "runs" / "dry-choice" / "prepared", dry_run[0] / "dry-run" / "prepared"
    assert (shared / "validation.en").read_text() == (own / "validation.en").read_text()
    capsys.readouterr()
    bench_quality.main(["train", *args])
    assert capsys.readouterr().out.count("finished already") == 4
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"select": {"from": [str(selection)]}}))
    with pytest.raises(SystemExit, match="chooses among budgets that train"):
        bench_quality.main(["train", "--budget", str(nested)])


class FakeRun:
    """A started run (`subprocess.Popen`) that records its GPU and ends at its given poll."""

    def __init__(self, started: list, ends_at: dict, command, env, **kwargs):
        self.gpu, self.returncode, self.polls = env.get("CUDA_VISIBLE_DEVICES"), None, 0
        self.ends_at = ends_at[command[-1]]
        started.append((command[-1], self.gpu))

    def poll(self):
        self.polls += 1
        if self.polls >= self.ends_at:
            self.returncode = 0
        return self.returncode


@pytest.mark.parametrize("visible", [None, "4,6,7"])
def test_runs_are_spread_over_the_gpus(tmp_path, monkeypatch, visible):
    """`train --jobs 4` on 3 GPUs: each run sees one GPU (`CUDA_VISIBLE_DEVICES`, named as this process sees them),
    the one that the fewest running runs use, so the first runs go round-robin and a run that ends frees its GPU for
    the next; the CPU (`--device cpu`) and a GPU named by its index (`--device cuda:1`) leave the runs as they are."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(bench_quality.time, "sleep", lambda seconds: None)
    # runs 1 and 3 (on the first and second GPU) end first
    ends_at = {"run-0": 9, "run-1": 1, "run-2": 9, "run-3": 1, "run-4": 9, "run-5": 9}
    pending = [(name, tmp_path / name, ["python", name]) for name in ends_at]
    names = visible.split(",") if visible else ["0", "1", "2"]
    for device, expected in [(None, [0, 1, 2, 0, 1, 0]), ("cuda", [0, 1, 2, 0, 1, 0]), ("cpu", None),
                             ("cuda:1", None)]:
        started = []
        monkeypatch.setattr(bench_quality.subprocess, "Popen",
                            lambda command, started=started, **kwargs: FakeRun(started, ends_at, command, **kwargs))
        arguments = ["train", "--budget", "dry-run", "--root", str(tmp_path), "--jobs", "4"]
        bench_quality.run_pending(bench_quality.parse_args(arguments + (["--device", device] if device else [])),
                                  pending)
        assert [name for name, _ in started] == list(ends_at)
        gpus = [gpu for _, gpu in started]
        assert gpus == ([names[index] for index in expected] if expected else [visible] * 6), device
