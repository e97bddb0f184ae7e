"""What `mgsa-hf train` saves and what goes to the Hub: the recipe's decoding settings in the saved generation config,
a model folder that holds the model alone (the run's checkpoints and results beside it), and the files and model card
each way of publishing uploads, against a Hub client mocked at the `HfApi` level."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_DIR
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl
from huggingface_hub.errors import EntryNotFoundError
from huggingface_hub.utils import filter_repo_objects
from transformers import AutoModelForSeq2SeqLM, AutoProcessor, GenerationConfig

from mgsa_hf import MgsaConfig
from mgsa_hf.evaluation import decode_token_ids
from mgsa_hf.modeling_common import card_for_repository
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.model_card import CardDataset, build_model_card, card_dataset, card_repo_id
from mgsa_hf.training.ownership import run_folder
from mgsa_hf.training.run import train


REPO = Path(__file__).resolve().parents[1]
DATA = MULTI30K_DIR
TINY = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"
USER = "someone"  # the namespace the mocked Hub gives repositories named without one


class FakeHub:
    """The Hub as `HfApi` sees it: `create_repo`, `create_commit`, `upload_folder` and the model card download
    (`hf_hub_download` of `README.md`) work on repositories kept in memory, `{repo_id: {path: bytes}}`; `commits`
    lists `(repo_id, [paths])` per commit."""

    def __init__(self, card_folder: Path):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[tuple[str, list[str]]] = []
        self.card_folder = card_folder

    def create_repo(self, repo_id, *, exist_ok=False, **_):
        repo_id = repo_id if "/" in repo_id else f"{USER}/{repo_id}"
        if repo_id in self.repos and not exist_ok:
            raise ValueError(f"{repo_id} exists")
        self.repos.setdefault(repo_id, {})
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, *, commit_message, **_):
        files = self.repos[repo_id]
        paths = []
        for operation in operations:
            with operation.as_file() as handle:
                files[operation.path_in_repo] = handle.read()
            paths.append(operation.path_in_repo)
        self.commits.append((repo_id, sorted(paths)))
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/{len(self.commits):040x}",
                          commit_message=commit_message, commit_description="", oid=f"{len(self.commits):040x}")

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None,
                      allow_patterns=None, ignore_patterns=None, **_):
        from huggingface_hub import CommitOperationAdd

        folder = Path(folder_path)
        paths = [path.relative_to(folder).as_posix() for path in sorted(folder.glob("**/*")) if path.is_file()]
        ignore = [*([ignore_patterns] if isinstance(ignore_patterns, str) else ignore_patterns or []), ".git/*"]
        prefix = f"{path_in_repo.strip('/')}/" if path_in_repo else ""
        operations = [CommitOperationAdd(path_or_fileobj=str(folder / path), path_in_repo=prefix + path)
                      for path in filter_repo_objects(paths, allow_patterns=allow_patterns, ignore_patterns=ignore)]
        return self.create_commit(repo_id, operations, commit_message=commit_message or "Upload folder")

    def hf_hub_download(self, repo_id, filename, **_):
        content = self.repos.get(repo_id, {}).get(filename)
        if content is None:
            raise EntryNotFoundError(f"{filename} not found in {repo_id}")
        path = self.card_folder / repo_id.replace("/", "--") / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return str(path)

    def card(self, repo_id) -> ModelCard:
        return ModelCard(self.repos[repo_id]["README.md"].decode())


@pytest.fixture
def hub(monkeypatch, tmp_path):
    fake = FakeHub(tmp_path / "downloads")
    monkeypatch.setattr(HfApi, "create_repo", fake.create_repo)
    monkeypatch.setattr(HfApi, "create_commit", fake.create_commit)
    monkeypatch.setattr(HfApi, "upload_folder", fake.upload_folder)
    monkeypatch.setattr("huggingface_hub.repocard.hf_hub_download", fake.hf_hub_download)
    return fake


def tiny_config(output_dir, *overrides):
    return load_train_config(TINY, [f"data={DATA}", f"output_dir={output_dir}", *overrides])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A transformer trained for two steps and scored with beam 2, at most 12 tokens: (results, model folder)."""
    folder = tmp_path_factory.mktemp("publish") / "tiny-multi30k"
    results, _ = train(tiny_config(folder, "training.max_steps=2", "training.generation_num_beams=2"))
    return results, folder


def files_under(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def test_saved_generation_config_reproduces_the_scored_translations(trained):
    """`generate` without arguments on the saved folder writes the test translations the run scored: the recipe's
    `generation_num_beams` and `generation_max_length` are the saved generation config's."""
    results, folder = trained
    generation_config = GenerationConfig.from_pretrained(folder)
    assert (generation_config.num_beams, generation_config.max_length) == (2, 12)

    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    sources = list(read_lines(DATA / "test_2016_flickr.en.gz", 8))
    with torch.no_grad():
        output_ids = model.generate(**processor(sources, return_tensors="pt", truncation=True, max_length=32))
    translations = decode_token_ids(processor.tokenizer, output_ids)
    assert translations == (run_folder(folder) / "test.hyp.de").read_text().splitlines()
    # and those are the translations whose scores the card reports
    test_scores = next(row for row in results["scores"] if row["split"] == "test")
    from mgsa_hf.evaluation import translation_scores

    references = list(read_lines(DATA / "test_2016_flickr.de.gz", 8))
    assert translation_scores(translations, references)["bleu"] == pytest.approx(test_scores["bleu"])
    # the README's line: the translation pipeline on the saved folder decodes as the scores were computed
    from transformers import pipeline

    translator = pipeline("translation", model=str(folder), device="cpu", truncation=True)
    assert [row["translation_text"] for row in translator(sources, batch_size=3)] == translations


def test_the_model_folder_holds_the_model_and_the_run_folder_the_rest(trained):
    """The folder `pipeline(...)` loads and `hf upload` publishes has the model's files only; the checkpoints, the
    trained tokenizer, the results and the scored translations are in `<output_dir>-run`."""
    _, folder = trained
    run_dir = run_folder(folder)
    assert run_dir == folder.parent / "tiny-multi30k-run"
    saved = files_under(folder)
    assert {"config.json", "generation_config.json", "model.safetensors", "README.md", "processor_config.json",
            "tokenizer.json", "pipeline_translation.py", "modeling_mgsa.py", "processing_mgsa.py"} <= set(saved)
    assert not [path for path in saved if "/" in path or path == "results.json" or ".hyp." in path], saved
    assert (run_dir / "checkpoints" / "checkpoint-2" / "optimizer.pt").is_file()
    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()
    assert json.loads((run_dir / "results.json").read_text())["global_step"] == 2
    assert {path.name for path in run_dir.glob("*.hyp.de")} == {"validation.hyp.de", "test.hyp.de"}


def test_uploading_the_folder_publishes_the_model_and_its_card(trained, hub):
    """`hf upload` / `upload_folder` of the saved folder: every file of the model, processor and code, none of the
    run's, and the package's card with its model-index (the dataset by its Hub id and the Hub's split names, which
    bentrevett/multi30k calls train / validation / test), its code naming a placeholder repository that the card
    asks to replace, never the bare folder name."""
    results, folder = trained
    HfApi().create_repo("tiny", exist_ok=True)
    HfApi().upload_folder(repo_id=f"{USER}/tiny", folder_path=folder)
    assert hub.commits == [(f"{USER}/tiny", files_under(folder))]
    uploaded = hub.repos[f"{USER}/tiny"]
    assert not [path for path in uploaded if path.startswith(("checkpoints/", "tokenizer/")) or ".hyp." in path
                or path in ("results.json", "optimizer.pt", "rng_state.pth", "training_args.bin")]
    card = hub.card(f"{USER}/tiny")
    assert card.data.datasets == ["bentrevett/multi30k"]
    scores = {(result.dataset_type, result.dataset_split, result.metric_type): result.metric_value
              for result in card.data.eval_results}
    assert {result.dataset_split for result in card.data.eval_results} == {"validation", "test"}
    for row in results["scores"]:
        for metric in ("bleu", "chrf"):
            key = ("bentrevett/multi30k", row["split"], metric)
            assert scores[key] == pytest.approx(row[metric], abs=0.01)
    assert 'model="<your-username>/tiny-multi30k"' in card.text and "Replace `<your-username>/tiny-multi30k`" in \
        card.text
    assert 'model="tiny-multi30k"' not in card.text and card.data.base_model is None

    # for a careful reader: the splits by their own names, the size, the data's terms, what the model is for
    table = card.text.split("## Results")[1]
    assert "| `test_2016_flickr` (the Hub's `test`) |" in table and "| `val` (the Hub's `validation`) |" in table
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert f"{model.num_parameters():,} parameters" in card.text
    assert "Multi30k's image captions" in card.text and "publishes no licence" in card.text
    assert "https://github.com/multi30k/dataset" in card.text and "anything but research" in card.text
    assert "## Intended use and limitations" in card.text and "or repeat a piece over and" in card.text
    assert "no_repeat_ngram_size=4)` cuts such loops short" in card.text  # no guard saved: how to add one
    assert card.data.tags == ["translation", "mgsa-hf", "transformer"]  # a plain Transformer is not syntax-aware


def test_processor_push_uploads_the_processor_files_only(trained, hub):
    """`processor.save_pretrained(folder, push_to_hub=True)` on the trained folder uploads what a processor save
    writes (here: tokenizer, processor config and code), not the model, card or anything else in the folder."""
    _, folder = trained
    processor = AutoProcessor.from_pretrained(folder)
    with tempfile.TemporaryDirectory() as alone:
        processor.save_pretrained(alone)
        processor_files = files_under(Path(alone))
    assert "model.safetensors" not in processor_files and "processor_config.json" in processor_files

    processor.save_pretrained(folder, push_to_hub=True, repo_id="tiny-processor")
    assert hub.commits == [(f"{USER}/tiny-processor", processor_files)]
    processor.push_to_hub("tiny-processor-2")  # transformers' own: into an empty folder, with a card of its own
    assert hub.commits[1] == (f"{USER}/tiny-processor-2", sorted([*processor_files, "README.md"]))


def test_model_and_processor_push_keep_the_published_card(trained, hub):
    """After the folder is published, `model.push_to_hub` and `processor.push_to_hub` (say, of a model trained
    further) upload their own files and keep the card on the Hub, model-index and all; the model's generation
    config carries the recipe's decoding settings."""
    _, folder = trained
    HfApi().upload_folder(repo_id=HfApi().create_repo("tiny").repo_id, folder_path=folder)
    published = hub.card(f"{USER}/tiny")
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.push_to_hub("tiny")
    AutoProcessor.from_pretrained(folder).push_to_hub("tiny")
    model_files = hub.commits[1][1]
    assert {"config.json", "generation_config.json", "model.safetensors", "modeling_mgsa.py", "README.md"} <= set(
        model_files)
    assert not [path for path in model_files if path.startswith("checkpoints/") or path == "results.json"]
    assert json.loads(hub.repos[f"{USER}/tiny"]["generation_config.json"])["num_beams"] == 2
    card = hub.card(f"{USER}/tiny")
    assert card.data.eval_results == published.data.eval_results and card.text == published.text


def test_model_push_to_a_new_repository_publishes_the_package_card(trained, hub):
    """`model.push_to_hub` of a model loaded from a trained folder, to a repository that has no card yet, publishes
    the folder's card (its model-index included) rather than Transformers' blank template, and the model's code with
    the translation pipeline that `config.custom_pipelines` names."""
    _, folder = trained
    local = ModelCard.load(folder / "README.md")
    AutoModelForSeq2SeqLM.from_pretrained(folder).push_to_hub("fresh")
    files = hub.repos[f"{USER}/fresh"]
    expected = {"README.md", "config.json", "model.safetensors", "modeling_mgsa.py", "pipeline_translation.py"}
    assert expected <= set(files)
    assert json.loads(files["config.json"])["custom_pipelines"]["mgsa-translation"]["impl"].startswith(
        "pipeline_translation.")
    card = hub.card(f"{USER}/fresh")  # the folder's card, naming the repository it was pushed to
    assert card.data.eval_results == local.data.eval_results
    assert card.text == card_for_repository(local.text, f"{USER}/fresh") != local.text
    assert f'pipeline("translation", model="{USER}/fresh")' in card.text
    assert "<your-username>" not in card.text and "Replace `" not in card.text


def test_training_with_push_to_hub_uploads_the_model_folder(tmp_path, hub, one_thread):
    """`training.push_to_hub=true` uploads the saved model folder, card included, once, after training (the
    Trainer's own push would upload its checkpoint folder: no processor, code or card)."""
    folder = tmp_path / "pushed"
    results, _ = train(tiny_config(folder, "training.max_steps=1", "training.eval_strategy=no",
                                   "training.push_to_hub=true", "training.hub_model_id=team/pushed"))
    assert results["hub_repo_id"] == "team/pushed"
    assert json.loads((run_folder(folder) / "results.json").read_text())["hub_repo_id"] == "team/pushed"
    assert hub.commits == [("team/pushed", files_under(folder))]
    card = hub.card("team/pushed")
    assert card.data.eval_results and card.data.eval_results[0].dataset_type == "bentrevett/multi30k"
    assert 'pipeline("translation", model="team/pushed")' in card.text  # the card names the model by its Hub id


@pytest.fixture(scope="module")
def trained_rhe(tmp_path_factory):
    """An RHE model (it reads the parse) trained for one step: its model folder."""
    folder = tmp_path_factory.mktemp("publish-rhe") / "tiny-rhe"
    train(tiny_config(folder, "model.encoder_type=rhe", "training.max_steps=1", "training.eval_strategy=no"))
    return folder


@pytest.mark.parametrize("encoder_type", ["transformer", "rhe"])
def test_the_card_says_how_to_load_the_model_and_it_works(encoder_type, request, tmp_path):
    """The card's code runs as it stands, with the repository id replaced by the folder: the first block with the
    package, the second where `mgsa_hf` cannot be imported (the folder's own code, `trust_remote_code=True`), for a
    model that reads no syntax and for one whose processor parses with spaCy."""
    folder = request.getfixturevalue("trained")[1] if encoder_type == "transformer" else request.getfixturevalue(
        "trained_rhe")
    card = ModelCard.load(folder / "README.md")
    blocks = re.findall(r"```python\n(.*?)```", card.text, flags=re.S)
    assert len(blocks) == 2 and "import mgsa_hf" in blocks[0] and "trust_remote_code=True" in blocks[1]
    assert "pip install mgsa-hf" not in card.text.split(blocks[0])[1]  # the package is not needed after it
    if encoder_type == "transformer":
        assert "reads no syntax" in card.text and "`transformers` and `torch` are all it needs" in card.text
        assert "(beam 2, at most 12 tokens)" in card.text
    else:
        assert "the parse needs spaCy and its English pipeline `en_core_web_sm`" in card.text
        assert "(beam 1, at most 12 tokens)" in card.text
    placeholder = f'"{card_repo_id(None, folder.name)}"'
    assert placeholder in blocks[0] and placeholder in blocks[1]
    with_package, without_package = (block.replace(placeholder, repr(str(folder))) for block in blocks)
    exec(compile(with_package, "card", "exec"), {})  # here, where the package is imported
    script = f"import sys\nsys.modules['mgsa_hf'] = None\n{without_package}\nprint('ran')\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ran"), result.stderr[-3000:]


MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")  # the local copy's files


@pytest.mark.parametrize(
    "data, pair, splits, expected",
    [
        ("../shared/data/multi30k", ("en", "de"), MULTI30K_SPLITS,
         ("bentrevett/multi30k", "Multi30k (task 1, en-de)", {"val": "validation", "test_2016_flickr": "test"})),
        ("/data/Multi30k", ("de", "en"), ("train", "val"), ("bentrevett/multi30k", "Multi30k (task 1, en-de)",
                                                            {"val": "validation"})),
        # the same folder scored on a split the Hub's dataset does not have: no Hub id, its own split names
        ("/data/multi30k", ("en", "de"), ("train", "val", "test_2017_flickr"), (None, "multi30k", {})),
        ("/data/multi30k", ("en", "fr"), MULTI30K_SPLITS, (None, "multi30k", {})),
        ("./corpora/news.jsonl", ("en", "de"), ("train", "dev"), (None, "news", {})),
        ("wmt/wmt16", ("en", "de"), ("train", "validation", "test"), ("wmt/wmt16", "wmt/wmt16", {})),
    ],
)
def test_card_names_the_dataset_by_its_hub_id_and_splits(data, pair, splits, expected):
    dataset = card_dataset(data, *pair, splits)
    assert isinstance(dataset, CardDataset) and (dataset.id, dataset.name) == expected[:2]
    assert {split: dataset.split_name(split) for split in splits if dataset.split_name(split) != split} == expected[2]


@pytest.mark.parametrize("encoder_type", ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"])
@pytest.mark.parametrize("init_from, base_model", [
    ("Helsinki-NLP/opus-mt-en-de", "Helsinki-NLP/opus-mt-en-de"),
    ("/cache/hub/models--Helsinki-NLP--opus-mt-en-de/snapshots/0123abcd", "Helsinki-NLP/opus-mt-en-de"),
    ("./converted-rhe", None),
    (None, None),
])
def test_card_links_its_paper_names_its_base_model_and_what_its_code_needs(encoder_type, init_from, base_model):
    config = MgsaConfig(d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=50,
                        encoder_type=encoder_type)
    card = build_model_card(config, model_id=card_repo_id("team/model", "model"), source_lang="en",
                            target_lang="de", dataset_name="news", train_size=10, hyperparameters={}, results=[],
                            parser="en_core_web_sm" if config.reads_source_syntax else None, init_from=init_from)
    papers = {"transformer": "https://arxiv.org/abs/1706.03762", "phrase_memory": "https://arxiv.org/abs/1909.02222",
              "phrase_representation": "https://aclanthology.org/2020.acl-main.37",
              "hybrid": "https://aclanthology.org/P19-1295", "rhe": "https://aclanthology.org/2021.emnlp-main.260"}
    assert f"*{config.variant.paper}*]({papers[encoder_type]})" in card.text
    assert card.data.base_model == base_model
    if base_model:
        assert f"Fine-tuned from [`{base_model}`](https://huggingface.co/{base_model})." in card.text
    elif init_from:
        assert "Fine-tuned from the local checkpoint `converted-rhe`" in card.text
    # the packages of the code path, named for the encoder type; the package itself only from its source or wheel
    install = "`pip install torch transformers" + (" 'spacy>=3.8.15,<3.9'`" if config.reads_source_syntax else "`")
    assert install in card.text and "pip install mgsa-hf" not in card.text
    assert "mgsa-hf is not published on a package index" in card.text and "from its source repository" in card.text
    # the tag and the parse's cost for the models that read the parse (not the transformer, hybrid or n-gram MG-SA)
    assert ("syntax-aware" in card.data.tags) == config.reads_source_syntax
    assert "syntax-aware" not in card.data.tags or encoder_type not in ("transformer", "hybrid")
    assert ("parsed with spaCy before it is translated" in card.text) == config.reads_source_syntax
    # a corpus the card does not know: its terms are the reader's to check
    assert "Check the licence and terms of news before using or sharing this model." in card.text
    assert 'model="team/model"' in card.text and "<your-username>" not in card.text and card.data.datasets is None
