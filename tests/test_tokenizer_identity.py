"""A model folder holding another model's tokenizer is refused by name: the model's `config.json` records the
vocabulary it was trained with (`tokenizer_vocabulary`), and loading the folder's processor or tokenizer with the
model compares it. Before, a `tokenizer.json` (or a Marian `vocab.json`, `source.spm`) copied in from another run
translated into wrong text without a word."""

import json
import re
import shutil

import pytest
import torch
from conftest import cli_error, tiny_sizes
from transformers import AutoTokenizer, MarianConfig, MarianMTModel, pipeline

from mgsa_hf import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor
from mgsa_hf.cli import main
from mgsa_hf.tokenization_utils import train_joint_tokenizer
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.conversion import convert_checkpoint
from mgsa_hf.training.run import build_model
from mgsa_hf.weights_checksums import TOKENIZER_RECORD, record_tokenizer, tokenizer_vocabulary


pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [
    ("A man rides a bike down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("Children play soccer in a park.", "Kinder spielen Fußball in einem Park."),
]
NOT_THE_MODELS = "is not the tokenizer the model was trained with"


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    root = tmp_path_factory.mktemp("texts")
    for lang, column in (("en", 0), ("de", 1)):
        (root / f"text.{lang}").write_text("\n".join(pair[column] for pair in PAIRS) + "\n", encoding="utf-8")
    return root


def tokenizer_of(texts, name: str, vocab_size: int, **options):
    return train_joint_tokenizer(texts / "text.en", texts / "text.de", texts / name, vocab_size=vocab_size, **options)


def tiny_model(tokenizer, processor=None, record: bool = True) -> MgsaForConditionalGeneration:
    torch.manual_seed(0)
    config = MgsaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        encoder_type="transformer", num_phrase_tags=len((processor or MgsaProcessor(tokenizer,
                                                                        with_syntax=False)).phrase_tags),
                        **tiny_sizes(encoder_layers=1))
    model = MgsaForConditionalGeneration(config)
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 3
    if record:
        record_tokenizer(model.config, tokenizer)
    return model


@pytest.fixture(scope="module")
def saved(texts, tmp_path_factory):
    """A tiny transformer saved with its processor (the training run's way: model, then processor), the tokenizer of
    another run (fewer tokens), and a source file: `(folder, other_tokenizer_folder, sources)`."""
    tokenizer, other = tokenizer_of(texts, "ours", 100), tokenizer_of(texts, "other", 45)
    assert tokenizer.get_vocab() != other.get_vocab()
    folder = tmp_path_factory.mktemp("saved") / "model"
    processor = MgsaProcessor(tokenizer)
    tiny_model(tokenizer, processor).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, texts / "other", texts / "text.en"


def copy_of(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "model")


def test_the_save_records_the_vocabulary_and_the_folder_loads(saved, tmp_path):
    folder, _, sources = saved
    record = json.loads((folder / "config.json").read_text())[TOKENIZER_RECORD]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert record == tokenizer_vocabulary(tokenizer) and record["tokens"] == len(tokenizer)
    MgsaProcessor.from_pretrained(folder)
    assert len(pipeline("translation", model=str(folder))("A man rides.")) == 1
    main(["translate", str(folder), "--input", str(sources), "--output", str(tmp_path / "out.de")])
    assert len((tmp_path / "out.de").read_text().splitlines()) == len(PAIRS)


def test_another_runs_tokenizer_json_is_refused_by_name(saved, tmp_path):
    folder, other, sources = saved
    folder = copy_of(folder, tmp_path)
    shutil.copyfile(other / "tokenizer.json", folder / "tokenizer.json")
    named = rf"{re.escape(str(folder / 'tokenizer.json'))} {NOT_THE_MODELS}: its vocabulary \(45 tokens"
    with pytest.raises(ValueError, match=named):
        MgsaProcessor.from_pretrained(folder)
    with pytest.raises(ValueError, match=named):
        pipeline("translation", model=str(folder))
    assert re.match(rf"mgsa-hf translate: error: {named}",
                    cli_error(["translate", folder, "--input", sources, "--output", tmp_path / "out.de"]))
    assert not (tmp_path / "out.de").exists()
    data = tmp_path / "data"
    data.mkdir()
    for lang in ("en", "de"):
        shutil.copyfile(sources.with_suffix(f".{lang}"), data / f"test.{lang}")
    assert re.match(rf"mgsa-hf evaluate: error: {named}",
                    cli_error(["evaluate", folder, "--data", data, "--split", "test"]))


def test_a_tokenizer_saved_again_with_the_same_vocabulary_loads(saved, texts, tmp_path):
    """The vocabulary is the identity, not the files' bytes: another layout of `tokenizer.json`, another
    `model_max_length` and a tokenizer trained again to the same vocabulary still load."""
    folder, _, _ = saved
    folder = copy_of(folder, tmp_path)
    tokenizer_file = folder / "tokenizer.json"
    tokenizer_file.write_text(json.dumps(json.loads(tokenizer_file.read_text()), indent=4))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 64}))
    assert MgsaProcessor.from_pretrained(folder).tokenizer.model_max_length == 64
    pipeline("translation", model=str(folder))("A man rides.")
    again = tokenizer_of(texts, "again", 90)  # these few sentences hold fewer pieces: the same vocabulary
    assert again.get_vocab() == AutoTokenizer.from_pretrained(folder).get_vocab()
    again.save_pretrained(folder)
    MgsaProcessor.from_pretrained(folder)


def test_a_folder_with_the_tokenizer_alone_is_checked_by_the_pipeline(texts, saved, tmp_path):
    """A checkpoint's folder (the Trainer saves the tokenizer, not the processor): the pipeline and `translate` load
    the tokenizer alone, and refuse another one."""
    _, other, sources = saved
    tokenizer = AutoTokenizer.from_pretrained(texts / "ours")
    folder = tmp_path / "checkpoint-2"
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pipeline("translation", model=str(folder))("A man rides.")
    shutil.copyfile(other / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(ValueError, match=rf"{re.escape(str(folder / 'tokenizer.json'))} {NOT_THE_MODELS}"):
        pipeline("translation", model=str(folder))
    assert NOT_THE_MODELS in cli_error(["translate", folder, "--input", sources])


def test_a_folder_without_the_record_still_loads_and_vocab_size_is_checked(saved, tmp_path):
    """A save that predates the record loads as before; a tokenizer with more tokens than the model embeds is
    refused naming `vocab_size`."""
    folder, _, _ = saved
    folder = copy_of(folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config[TOKENIZER_RECORD]
    (folder / "config.json").write_text(json.dumps(config))
    MgsaProcessor.from_pretrained(folder)
    pipeline("translation", model=str(folder))("A man rides.")
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 30}))
    with pytest.raises(ValueError, match=rf"tokenizer.json holds \d+ tokens, more than the 30 the model embeds "
                                         rf"\(`vocab_size` in {re.escape(str(folder / 'config.json'))}\)"):
        MgsaProcessor.from_pretrained(folder)


def test_training_records_the_runs_tokenizer(saved, texts, tmp_path):
    """The run's model (its checkpoints and final folder save its config) records the run's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(texts / "ours")
    model = build_model(load_train_config("tiny", []), tokenizer)
    assert getattr(model.config, TOKENIZER_RECORD) == tokenizer_vocabulary(tokenizer)


def test_convert_records_the_marian_tokenizer_and_names_a_changed_spm_file(texts, tmp_path):
    """A plain Marian folder (no record) converts, and its output records the SentencePiece tokenizer: a copied
    `source.spm` or `vocab.json` of another tokenizer is named."""
    tokenizer = tokenizer_of(texts, "marian", 80, tokenizer_type="marian")
    other = tokenizer_of(texts, "marian_other", 40, tokenizer_type="marian")
    source = tmp_path / "opus-mt"
    MarianMTModel(MarianConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                               decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                               **tiny_sizes())).save_pretrained(source)
    tokenizer.save_pretrained(source)
    converted = tmp_path / "converted"
    convert_checkpoint(str(source), str(converted), encoder_type="transformer")
    record = json.loads((converted / "config.json").read_text())[TOKENIZER_RECORD]
    assert record == tokenizer_vocabulary(tokenizer) and set(record["pieces_sha256"]) == {"source.spm", "target.spm"}
    MgsaProcessor.from_pretrained(converted)
    for name, message in (("source.spm", "is not the SentencePiece model the model was trained with"),
                          ("vocab.json", NOT_THE_MODELS)):
        damaged = shutil.copytree(converted, tmp_path / f"with-{name}")
        shutil.copyfile(texts / "marian_other" / name, damaged / name)
        with pytest.raises(ValueError, match=rf"{re.escape(str(damaged / name))} {message}"):
            MgsaProcessor.from_pretrained(damaged)
    assert other.get_vocab() != tokenizer.get_vocab()
