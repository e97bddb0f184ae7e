"""Bad input gets a clear error naming the argument (or a documented sane result), never a crash deep inside torch or
spaCy: the processor, `syntax()`, and forward/generate of every encoder type."""

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor


ENCODER_TYPES = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        (None, TypeError, "text"),
        (3, TypeError, "text"),
        (b"bytes", TypeError, "text"),
        ([["nested"]], TypeError, r"text\[0\]"),
        ([], ValueError, "empty list"),
        (["fine", "\ud800"], ValueError, r"text\[1\].*not valid Unicode.*surrogate"),
        ("x" * 1_000_001, ValueError, r"text\[0\] has 1,000,001 characters.*split it"),
    ],
)
def test_bad_text(multi30k_processor, text, error, match):
    with pytest.raises(error, match=match):
        multi30k_processor(text)


@pytest.mark.parametrize("name", ["max_length", "max_target_length", "pad_to_multiple_of"])
@pytest.mark.parametrize("value", [-1, 0, 2.5, True])
def test_bad_lengths(multi30k_processor, name, value):
    with pytest.raises(ValueError, match=name):
        multi30k_processor(["A dog runs."], text_target=["Ein Hund rennt."], **{name: value})


def test_a_python_package_that_is_no_pipeline(multi30k_processor):
    processor = MgsaProcessor(multi30k_processor.tokenizer, parser_name="spacy")
    with pytest.raises(ValueError, match="parser_name='spacy'.*not a spaCy pipeline"):
        processor(["A dog runs."])


def test_pipeline_that_is_not_installed(multi30k_processor):
    processor = MgsaProcessor(multi30k_processor.tokenizer, parser_name="xx_no_such_pipeline")
    with pytest.raises(OSError, match="not installed.*pip install xx_no_such_pipeline"):
        processor(["A dog runs."])


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
def test_over_long_text_without_truncation(multi30k_processor, tiny_config, encoder_type):
    """A 1000-word sentence: truncated with its syntax fields when `truncation=True`; without truncation the model
    raises a clear error naming `truncation=True` and its limit."""
    config = tiny_config(multi30k_processor, encoder_type, encoder_layers=1, phrase_memory_layers=[0],
                         hybrid_layers=[0], rhe_layers=[0])
    model = MgsaForConditionalGeneration(config).eval()
    text = " ".join(["a dog runs in the park ."] * 170)  # 1020 words
    truncated = multi30k_processor([text], max_length=128, truncation=True, return_tensors="pt")
    assert truncated["input_ids"].shape[1] == 128
    assert all(value.shape[-1] == 128 for value in truncated.values())
    with torch.no_grad():
        model.generate(**truncated, max_new_tokens=3)
    full = multi30k_processor([text], return_tensors="pt")
    assert full["input_ids"].shape[1] > 128
    with pytest.raises(ValueError, match=r"max_position_embeddings` = 128.*truncation=True, max_length=128"):
        with torch.no_grad():
            model.generate(**full, max_new_tokens=3)


ALIGNMENT_TEXTS = [
    "The ﬁrst ＡＢＣ dogs run… past a café.",
    "A dog </s> runs fast.",
    "Ein Hund läuft, собака бежит, 犬が走る and كلب يجري too.",
]


@pytest.mark.parametrize("processor_name", ["multi30k_processor", "marian_processor"])
@pytest.mark.parametrize("text", ALIGNMENT_TEXTS)
def test_every_subword_points_at_its_word(request, processor_name, text):
    """Text that NFKC normalisation changes, a literal `</s>` and mixed scripts, through the fast unigram and the
    Marian (SentencePiece) tokenizers: each content token's `word_ids` entry names a word its characters belong to
    (its NFKC surface lies inside that word's, or the word inside a token that spans several), in order."""
    import unicodedata

    processor = request.getfixturevalue(processor_name)
    encoding = processor(text)
    words = [unicodedata.normalize("NFKC", word) for word in processor.syntax(text).words]
    pieces = processor.tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    checked, previous = 0, -1
    for piece, word in zip(pieces, encoding["word_ids"], strict=True):
        surface = unicodedata.normalize("NFKC", piece.replace("\u2581", "")).strip()
        if word < 0 or not surface or piece in processor.tokenizer.all_special_tokens:
            continue
        assert surface in words[word] or words[word] in surface, (piece, word, words)
        assert word >= previous, "word indices run left to right"
        previous, checked = word, checked + 1
    assert checked >= len(words) // 2


@pytest.mark.parametrize("text", ["</s>", "A dog </s> runs <pad> fast."])
def test_special_token_written_in_the_text_is_text(marian_processor, text):
    """A literal `</s>` or `<pad>` in a source is text for a SentencePiece (opus-mt) tokenizer: only the appended EOS
    is special, where the tokenizer alone reads the literal as EOS or padding in the middle of the sentence."""
    tokenizer = marian_processor.tokenizer
    assert tokenizer(text)["input_ids"].count(tokenizer.eos_token_id) > 1  # the trap
    ids = marian_processor(text)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in ids


@pytest.mark.parametrize("processor_name", ["multi30k_processor", "marian_processor"])
def test_alignment_does_not_depend_on_normalisation(request, processor_name):
    """The same sentence written with characters NFKC changes and already normalised: the same tokens and the same
    word of each token."""
    import unicodedata

    processor = request.getfixturevalue(processor_name)
    text = ALIGNMENT_TEXTS[0]
    raw, normalized = processor(text), processor(unicodedata.normalize("NFKC", text))
    assert raw["input_ids"] == normalized["input_ids"]
    assert raw["word_ids"] == normalized["word_ids"]


@pytest.mark.parametrize("encoder_type", ENCODER_TYPES)
def test_attention_backends_run_or_say_which_they_support(multi30k_processor, multi30k_val, tiny_config,
                                                          encoder_type):
    """eager and sdpa give the same loss for every encoder type; flex attention runs or raises a ValueError naming
    the backends the variant supports, never a crash inside the kernel."""
    config = tiny_config(multi30k_processor, encoder_type, dropout=0.0, attention_dropout=0.0)
    sources, targets = (sentences[:3] for sentences in multi30k_val)
    batch = dict(multi30k_processor(sources, text_target=targets, return_tensors="pt"))
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(config).eval()
    losses = {}
    for backend in ("eager", "sdpa"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            losses[backend] = model(**batch).loss
    torch.testing.assert_close(losses["eager"], losses["sdpa"], atol=1e-5, rtol=1e-5)
    try:
        model.set_attn_implementation("flex_attention")
    except (ValueError, ImportError) as error:  # transformers refuses the backend on this machine
        pytest.skip(f"flex attention unavailable here: {error}")
    try:
        with torch.no_grad():
            flex = model(**batch).loss
    except ValueError as error:
        assert encoder_type in ("phrase_memory", "hybrid"), error
        assert "runs with attn_implementation in ['eager', 'sdpa']" in str(error)
    else:
        assert encoder_type not in ("phrase_memory", "hybrid")
        torch.testing.assert_close(flex, losses["sdpa"], atol=1e-4, rtol=1e-4)


# --- generation, pipeline, translate.py, model inputs, saved weights ---
# Counts given to `generate`, the pipeline and `scripts/translate.py`, the script's lines, RHE's syntax fields and the
# weights of a saved folder: each bad one gets an error naming it.

POSITIONS = 32  # max_position_embeddings of the saved tiny model below


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory, multi30k_processor, tiny_config):
    """(folder, model) of a tiny transformer with 32 positions, greedy and at most 6 new tokens, saved with a
    processor that reads no syntax."""
    folder = tmp_path_factory.mktemp("plain")
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1,
                                                     max_position_embeddings=POSITIONS, init_std=0.3)).eval()
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 6
    model.save_pretrained(folder)
    MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False).save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def plain_translator(plain_folder):
    from transformers import pipeline

    return pipeline("translation", model=str(plain_folder[0]), device="cpu")


def run_translate_script(argv):
    """`scripts/translate.py`'s `main(argv)`."""
    import runpy
    from pathlib import Path

    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "translate.py"))["main"](argv)


BAD_GENERATE_ARGUMENTS = [
    ({"num_beams": 0}, r"`num_beams` must be an integer >= 1, got 0"),
    ({"num_beams": -2}, r"`num_beams` must be an integer >= 1, got -2"),
    ({"num_beams": 2.5}, r"`num_beams` must be an integer >= 1, got 2.5"),
    ({"max_new_tokens": "5"}, r"`max_new_tokens` must be an integer >= 1, got '5'"),
    ({"num_return_sequences": 0}, r"`num_return_sequences` must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("arguments", "match"), BAD_GENERATE_ARGUMENTS)
def test_bad_generate_counts(multi30k_processor, tiny_config, tiny_t5_config, backbone, arguments, match):
    """`generate(num_beams=0)` divided by zero, `-2` made a negative tensor size, `2.5` and `max_new_tokens="5"` failed
    in torch's `repeat_interleave` / a comparison, `num_return_sequences=0` returned one sequence anyway."""
    from mgsa_hf import MgsaT5ForConditionalGeneration

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "transformer"))
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with pytest.raises(ValueError, match=match):
        model.eval().generate(**inputs, **arguments)


def test_bad_count_in_the_models_generation_config(multi30k_processor, tiny_config):
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1)).eval()
    model.generation_config.num_beams = 0
    inputs = multi30k_processor.tokenizer(["A dog runs."], return_tensors="pt")
    with pytest.raises(ValueError, match=r"`model.generation_config.num_beams` must be an integer >= 1, got 0"):
        model.generate(**inputs)


@pytest.mark.parametrize("given_to", ["call", "pipeline"])
@pytest.mark.parametrize(("arguments", "match"), BAD_GENERATE_ARGUMENTS)
def test_bad_generate_counts_through_the_pipeline(plain_folder, plain_translator, given_to, arguments, match):
    from transformers import pipeline

    with pytest.raises(ValueError, match=match):
        if given_to == "call":
            plain_translator(["A dog runs."], **arguments)
        else:
            pipeline("translation", model=str(plain_folder[0]), device="cpu", **arguments)(["A dog runs."])


@pytest.mark.parametrize("given_to", ["call", "pipeline"])
@pytest.mark.parametrize(("name", "value"), [("batch_size", -1), ("batch_size", 0), ("batch_size", 2.5),
                                             ("num_workers", -1)])
def test_bad_pipeline_batching(plain_folder, plain_translator, given_to, name, value):
    """`batch_size=-1` returned `[]`, `0` failed inside torch's DataLoader."""
    from transformers import pipeline

    match = rf"`{name}` must be an integer >= {1 if name == 'batch_size' else 0}, got {value}"
    with pytest.raises(ValueError, match=match):
        if given_to == "call":
            plain_translator(["A dog runs.", "A cat sleeps."], **{name: value})
        else:
            pipeline("translation", model=str(plain_folder[0]), device="cpu", **{name: value})(["A dog runs."])


@pytest.mark.parametrize("option", ["--batch-size", "--num-beams", "--max-length", "--max-new-tokens",
                                    "--max-source-length"])
@pytest.mark.parametrize("value", ["-1", "0"])
def test_bad_translate_script_counts(plain_folder, capsys, option, value):
    """`--batch-size -1` exited 0 writing nothing, `--batch-size 0` and `--num-beams 0` failed deep inside."""
    import re

    with pytest.raises(SystemExit) as exit_info:
        run_translate_script([str(plain_folder[0]), option, value])
    assert exit_info.value.code == 2
    assert re.search(rf"argument {option}: {value} is not a positive integer", capsys.readouterr().err)


def test_translate_script_gives_one_line_per_input_line(plain_folder, plain_translator, tmp_path):
    """A lone `\\r` (or U+2028) inside a line split it in two; a `\\r\\n` ending is one line break."""
    lines = ["A dog runs.\rA cat sleeps.", "Two men talk.\u2028Outside.", "A girl sings."]
    (tmp_path / "src.en").write_bytes(f"{lines[0]}\r\n{lines[1]}\n{lines[2]}".encode())
    run_translate_script([str(plain_folder[0]), "--input", str(tmp_path / "src.en"),
                          "--output", str(tmp_path / "hyp.de"), "--batch-size", "2"])
    written = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")
    assert written == [row["translation_text"] for row in plain_translator(lines)] + [""]


def test_translate_script_over_long_line(plain_folder, plain_translator, tmp_path):
    """An over-long line stopped the file deep inside the model; now its error names the file, the line and the
    options that cut it, and `--truncation` cuts it to the model's positions."""
    long_line = " ".join(["a dog runs in the park ."] * 8)
    (tmp_path / "src.en").write_text(f"A dog runs.\n{long_line}\nA girl sings.\n", encoding="utf-8")
    argv = [str(plain_folder[0]), "--input", str(tmp_path / "src.en"), "--output", str(tmp_path / "hyp.de")]
    with pytest.raises(SystemExit, match=rf"src.en, line 2: \d+ tokens, more than the model's {POSITIONS} positions: "
                                         rf"pass --truncation or --max-source-length {POSITIONS}"):
        run_translate_script(argv)
    run_translate_script([*argv, "--truncation"])
    expected = plain_translator(["A dog runs.", long_line, "A girl sings."], max_source_length=POSITIONS)
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines() == [row["translation_text"]
                                                                              for row in expected]


def test_pipeline_over_long_source(plain_translator):
    """`truncation=True` cut at the tokenizer's `model_max_length` (512), past the model's 32 positions, and the
    sentence failed inside the model; now it cuts at the positions, and without it the error names both options."""
    from mgsa_hf.pipeline_translation import SourceTooLongError

    long_line = " ".join(["a dog runs in the park ."] * 8)
    assert plain_translator.tokenizer.model_max_length > POSITIONS
    with pytest.raises(SourceTooLongError, match=rf"pass `truncation=True` or `max_source_length={POSITIONS}`"):
        plain_translator(long_line)
    assert plain_translator(long_line, truncation=True) == plain_translator(long_line, max_source_length=POSITIONS)


def wrong_head(batch):
    batch["head_word_ids"][0, 1] = 99


def negative_head(batch):
    batch["head_word_ids"][0, 1] = -5


def phrase_end_past_the_sentence(batch):
    last = int(batch["attention_mask"][1].sum()) - 1  # the shorter sentence's EOS
    batch["local_phrase_end"][1, last] = batch["input_ids"].shape[1] + 3


def phrase_start_after_its_token(batch):
    batch["local_phrase_start"][0, 0] = 2


def negative_depth(batch):
    batch["tree_depth"][0, 2] = -1


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("corrupt", "field"), [
    (wrong_head, "head_word_ids"), (negative_head, "head_word_ids"),
    (phrase_end_past_the_sentence, "local_phrase_end"), (phrase_start_after_its_token, "local_phrase_start"),
    (negative_depth, "tree_depth"),
])
def test_rhe_syntax_fields_out_of_range(multi30k_processor, tiny_config, tiny_t5_config, backbone, corrupt, field):
    """RHE read a head past the sentence, or a local phrase past its end, and its logits moved silently (MG-SA and
    PR refuse phrase ids past the sequence)."""
    from mgsa_hf import MgsaT5ForConditionalGeneration

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "rhe", encoder_layers=1, rhe_layers=[0]))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "rhe", rhe_layers=[0]))
    batch = multi30k_processor(["Two young men play football in a park.", "A dog runs."],
                               text_target=["Zwei Männer spielen.", "Ein Hund rennt."], return_tensors="pt")
    with torch.no_grad():
        model.eval()(**batch)  # the processor's fields pass
        corrupt(batch)
        with pytest.raises(ValueError, match=rf"`{field}` holds a value the processor never makes"):
            model(**batch)


def flip_a_weight_byte(path):
    """Flip one byte in the data part of a safetensors file (past its JSON header)."""
    import struct

    data = bytearray(path.read_bytes())
    header_size = struct.unpack("<Q", data[:8])[0]
    data[8 + header_size + (len(data) - 8 - header_size) // 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize("sharded", [False, True])
def test_damaged_weights_are_refused(multi30k_processor, tiny_config, tiny_t5_config, tmp_path, backbone, sharded):
    """A flipped byte in a weight loaded without error (wrong losses, or NaN): the folder records the SHA-256 of its
    weights and loading checks it; a folder without the record loads as before."""
    import hashlib
    import re

    from mgsa_hf import MgsaT5ForConditionalGeneration
    from mgsa_hf.evaluation import average_checkpoints

    if backbone == "marian":
        model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    else:
        model = MgsaT5ForConditionalGeneration(tiny_t5_config(multi30k_processor, "transformer"))
    model.save_pretrained(tmp_path, **({"max_shard_size": "40KB"} if sharded else {}))
    weights = sorted(tmp_path.glob("model*.safetensors"))
    assert len(weights) > 1 if sharded else [path.name for path in weights] == ["model.safetensors"]
    record = (tmp_path / "weights.sha256").read_text().splitlines()
    for path in weights:  # `sha256sum`'s format
        assert f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}" in record
    type(model).from_pretrained(tmp_path)

    flip_a_weight_byte(weights[-1])
    with pytest.raises(ValueError, match=rf"{re.escape(str(weights[-1]))} does not hold the weights that were saved"):
        type(model).from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not hold the weights that were saved"):
        average_checkpoints([tmp_path, tmp_path])  # `average_last_checkpoints` reads the checkpoints' files itself
    (tmp_path / "weights.sha256").unlink()
    type(model).from_pretrained(tmp_path)  # no record: loaded as before


def test_every_save_records_its_weights(multi30k_processor, tiny_config, tmp_path, monkeypatch):
    """`Trainer.save_model`, a Trainer checkpoint and `push_to_hub` (through `save_pretrained(push_to_hub=True)` too)
    write the record beside the weights, and the pipeline refuses a damaged folder."""
    import hashlib

    from huggingface_hub import CommitInfo, HfApi, RepoUrl
    from huggingface_hub.errors import EntryNotFoundError
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, pipeline

    from mgsa_hf import MgsaDataCollator

    uploads = {}

    def create_commit(self, repo_id, operations, *, commit_message, **_):
        for operation in operations:
            with operation.as_file() as handle:
                uploads[(repo_id, operation.path_in_repo)] = handle.read()
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/{0:040x}",
                          commit_message=commit_message, commit_description="", oid=f"{0:040x}")

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **_: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "create_commit", create_commit)

    def no_card(repo_id, filename, **_):
        raise EntryNotFoundError(f"{filename} not found in {repo_id}")

    monkeypatch.setattr("huggingface_hub.repocard.hf_hub_download", no_card)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, "transformer", encoder_layers=1))
    model.push_to_hub("someone/pushed")
    model.save_pretrained(tmp_path / "saved", push_to_hub=True, repo_id="someone/saved")
    for repo_id in ("someone/pushed", "someone/saved"):
        digest = hashlib.sha256(uploads[(repo_id, "model.safetensors")]).hexdigest()
        assert uploads[(repo_id, "weights.sha256")].decode() == f"{digest}  model.safetensors\n"

    plain = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False)
    encoded = plain(["A dog runs.", "A cat sleeps."], text_target=["Ein Hund rennt.", "Eine Katze schläft."])
    pairs = [{name: values[i] for name, values in encoded.items()} for i in range(2)]
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True, max_steps=1,
                                         save_steps=1, per_device_train_batch_size=2)
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=pairs, processing_class=plain,
                             data_collator=MgsaDataCollator(tokenizer=plain.tokenizer))
    trainer.train()
    trainer.save_model(tmp_path / "trained")
    for folder in (tmp_path / "saved", tmp_path / "trained", tmp_path / "run" / "checkpoint-1"):
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        assert (folder / "weights.sha256").read_text() == f"{digest}  model.safetensors\n"

    flip_a_weight_byte(tmp_path / "trained" / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors does not hold the weights that were saved"):
        pipeline("translation", model=str(tmp_path / "trained"), device="cpu")
