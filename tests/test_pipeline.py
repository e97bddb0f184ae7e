"""The translation pipeline as a Transformers pipeline: the model's generation config decides unless told otherwise,
length arguments bound the output, every input kind a pipeline takes, batches that translate as single sentences,
one list per sentence for `num_return_sequences`, and the pipeline's code in every saved folder (plain
`save_pretrained`, `Trainer.save_model`) for `trust_remote_code=True` where the package is not installed."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor


pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
# what the folders' generation configs say: neither greedy nor transformers' global 20-token bound
NUM_BEAMS, MAX_LENGTH = 3, 24


def save_folder(folder, processor, tiny_config, encoder_type, **fields):
    """A tiny model of `encoder_type` with its processor, saved by a plain `save_pretrained`, whose generation config
    says `num_beams=NUM_BEAMS, max_length=MAX_LENGTH`; returns the model. Its weights are drawn wide (`init_std`
    0.3) so that its translations differ from sentence to sentence."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(processor, encoder_type, init_std=0.3, **fields)).eval()
    model.generation_config.num_beams, model.generation_config.max_length = NUM_BEAMS, MAX_LENGTH
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model


def generated(model, processor, sources, **settings) -> list[list[str]]:
    """The translations `generate` makes of the padded batch: one list (of `num_return_sequences`) per sentence."""
    with torch.no_grad():
        output_ids = model.generate(**processor(sources, return_tensors="pt"), **settings)
    texts = [text.strip() for text in processor.tokenizer.batch_decode(output_ids, skip_special_tokens=True)]
    per_sentence = len(texts) // len(sources)
    return [texts[i : i + per_sentence] for i in range(0, len(texts), per_sentence)]


def rows(texts: list[str]) -> list[dict]:
    return [{"translation_text": text} for text in texts]


@pytest.fixture(scope="module")
def sources(multi30k_val):
    """Five Multi30k sentences of 9 to 26 tokens."""
    return multi30k_val[0][:5]


@pytest.fixture(scope="module")
def rhe_folder(tmp_path_factory, multi30k_processor, tiny_config):
    """(folder, model) of an RHE model, which reads dependency heads and local phrases."""
    folder = tmp_path_factory.mktemp("rhe")
    return folder, save_folder(folder, multi30k_processor, tiny_config, "rhe")


@pytest.fixture(scope="module")
def rhe_translator(rhe_folder):
    return pipeline("translation", model=str(rhe_folder[0]), device="cpu")


def test_the_folders_generation_config_decides(rhe_folder, rhe_translator, multi30k_processor, sources):
    """Without generation arguments the pipeline decodes as `generate` does with the folder's generation config
    (beam 3, at most 24 tokens), not greedily with transformers' 20-token default; arguments given to the call or to
    `pipeline(...)` override it."""
    _, model = rhe_folder
    expected = generated(model, multi30k_processor, sources)
    assert expected == generated(model, multi30k_processor, sources, num_beams=NUM_BEAMS, max_length=MAX_LENGTH)
    assert expected != generated(model, multi30k_processor, sources, num_beams=1, max_length=20)
    assert rhe_translator(sources) == rows([texts[0] for texts in expected])

    greedy = [texts[0] for texts in generated(model, multi30k_processor, sources, num_beams=1, max_length=20)]
    assert rhe_translator(sources, num_beams=1, max_length=20) == rows(greedy)
    folder = str(rhe_folder[0])
    assert pipeline("translation", model=folder, device="cpu", num_beams=1, max_length=20)(sources) == rows(greedy)


@pytest.mark.parametrize("length_argument", [{"max_length": 6}, {"max_new_tokens": 4}])
@pytest.mark.parametrize("given_to", ["call", "pipeline"])
def test_length_arguments_bound_the_translation(rhe_folder, multi30k_processor, sources, length_argument, given_to):
    """`max_length` / `max_new_tokens` bound the output as in `generate` (before, `max_length` cut the source)."""
    folder, model = rhe_folder
    if given_to == "call":
        translations = pipeline("translation", model=str(folder), device="cpu")(sources, **length_argument)
    else:
        translations = pipeline("translation", model=str(folder), device="cpu", **length_argument)(sources)
    with torch.no_grad():
        output_ids = model.generate(**multi30k_processor(sources, return_tensors="pt"), **length_argument)
    # `max_length` counts the decoder start token, `max_new_tokens` does not
    bound = length_argument.get("max_length") or length_argument["max_new_tokens"] + 1
    assert output_ids.shape[-1] <= bound < MAX_LENGTH
    texts = multi30k_processor.tokenizer.batch_decode(output_ids, skip_special_tokens=True)
    expected = [text.strip() for text in texts]
    assert translations == rows(expected)
    assert translations != rows([texts[0] for texts in generated(model, multi30k_processor, sources)])


def test_source_truncation_has_its_own_names(rhe_folder, rhe_translator, multi30k_processor, sources, caplog):
    """`max_source_length` cuts the source (with its syntax fields) as the processor does, and so does
    `truncation=True` at the tokenizer's limit; a source as long as the output bound is warned about."""
    _, model = rhe_folder
    longest = max(sources, key=len)
    cut = multi30k_processor([longest], max_length=7, truncation=True, return_tensors="pt")
    with torch.no_grad():
        cut_ids = model.generate(**cut)
    expected = multi30k_processor.tokenizer.decode(cut_ids[0], skip_special_tokens=True).strip()
    assert rhe_translator(longest, max_source_length=7) == rows([expected])
    assert rhe_translator(longest) != rows([expected])
    inputs = rhe_translator.preprocess(longest, max_source_length=7)
    # the syntax fields RHE reads, no others, as the processor makes them
    assert list(inputs) == ["input_ids", "attention_mask", *model.config.source_syntax_fields]
    assert all(torch.equal(inputs[name], cut[name]) for name in inputs)

    translator = pipeline("translation", model=str(rhe_folder[0]), device="cpu")
    translator.processor.tokenizer.model_max_length = 7
    assert translator.preprocess(longest, truncation=True)["input_ids"].shape == (1, 7)
    assert translator(longest, truncation=True) == rows([expected])

    with pytest.raises(ValueError, match="max_source_length=7 cuts the source, but truncation=False"):
        rhe_translator(longest, max_source_length=7, truncation=False)
    with pytest.raises(ValueError, match="max_source_length must be a positive integer, got 0"):
        rhe_translator(longest, max_source_length=0)

    with caplog.at_level(logging.WARNING):
        rhe_translator(longest, max_length=9)
    assert "max_length=9 tokens" in caplog.text and "cut short" in caplog.text


@pytest.mark.parametrize(
    "encoder_type, fields",
    [("rhe", {}), ("phrase_memory", {}),
     ("phrase_representation", {"pr_segmentation": "parse"})],
)
def test_every_input_kind_and_batches_translate_as_single_sentences(
    tmp_path, multi30k_processor, tiny_config, sources, encoder_type, fields
):
    """A string, list, tuple, `datasets` column, `KeyDataset`, generator and iterator give each sentence's
    translation alone; batches (padded with each syntax field's own value) give the same as one sentence at a
    time."""
    import datasets
    from transformers.pipelines.pt_utils import KeyDataset

    model = save_folder(tmp_path, multi30k_processor, tiny_config, encoder_type, **fields)
    alone = [generated(model, multi30k_processor, [source])[0][0] for source in sources]
    translator = pipeline("translation", model=str(tmp_path), device="cpu")
    # a batch is padded as the processor pads it: each field with its own value, levelled fields per level
    batch = translator._collate([translator.preprocess(source) for source in sources])
    padded = multi30k_processor(sources, return_tensors="pt")
    assert list(batch) == ["input_ids", "attention_mask", *model.config.source_syntax_fields]  # those it reads
    assert all(torch.equal(batch[name], padded[name]) for name in batch)
    assert translator(sources[0]) == rows(alone[:1])
    for batch_size in (1, 2, 5):
        assert translator(sources, batch_size=batch_size) == rows(alone), batch_size
    assert translator(tuple(sources), batch_size=2) == rows(alone)
    dataset = datasets.Dataset.from_dict({"en": sources})
    assert translator(dataset["en"], batch_size=2) == rows(alone)
    # streamed inputs give an iterator over each sentence's list of translations
    streamed = [rows([text]) for text in alone]
    assert list(translator(KeyDataset(dataset, "en"), batch_size=2)) == streamed
    assert list(translator((source for source in sources), batch_size=3)) == streamed
    assert list(translator(iter(sources), batch_size=2)) == streamed


@pytest.mark.parametrize("given", ["object", "folder"])
@pytest.mark.parametrize("encoder_type, fields, reads_syntax",
                         [("hybrid", {}, False),
                          ("phrase_memory", {"phrase_partition": "ngram", "phrase_composition": "sans",
                                             "phrase_tag_supervision": False, "phrase_interaction": "none"}, False),
                          ("rhe", {}, True)])
def test_a_model_with_a_tokenizer_and_no_processor(multi30k_processor, tiny_config, sources, tmp_path, caplog, given,
                                                    encoder_type, fields, reads_syntax):
    """A model with its tokenizer and no processor settings, given as objects (`pipeline("translation", model=model,
    tokenizer=tokenizer)`) or as a folder saved with its tokenizer alone (as an opus-mt folder is).

    A model that reads no syntax (hybrid attention, n-gram MG-SA) translates as `generate` does from the tokenizer's
    inputs, and nothing is parsed. One that reads syntax (RHE): as objects, it is refused with the reason, not run
    without its syntax fields; as a folder, the processor is built with the default settings and a warning says so
    (`MgsaProcessor.from_pretrained`), and it translates as `generate` does from a default processor."""
    torch.manual_seed(0)
    model = MgsaForConditionalGeneration(tiny_config(multi30k_processor, encoder_type, init_std=0.3, **fields)).eval()
    # a bound of its own, as a saved model's generation config has: where it has none, Transformers 5.17's pipeline
    # fills in the global `max_length=20` while its `generate` lets an encoder-decoder make 21 tokens
    model.generation_config.num_beams, model.generation_config.max_length = NUM_BEAMS, MAX_LENGTH
    assert model.config.reads_source_syntax == reads_syntax
    tokenizer = multi30k_processor.tokenizer
    if given == "object":
        arguments = dict(model=model, tokenizer=tokenizer)
    else:
        model.save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
        assert not (tmp_path / "processor_config.json").exists()
        arguments = dict(model=str(tmp_path))
    if reads_syntax and given == "object":
        with pytest.raises(ValueError, match="reads the source syntax"):
            pipeline("translation", device="cpu", **arguments)
        return
    with caplog.at_level(logging.WARNING):
        translator = pipeline("translation", device="cpu", **arguments)
    warned = [record.getMessage() for record in caplog.records if "processor_config.json" in record.getMessage()]
    if reads_syntax:
        assert translator.processor.with_syntax and len(warned) == 1 and "default settings" in warned[0]
        expected = generated(model, MgsaProcessor(tokenizer), sources)
        assert translator(sources, batch_size=2) == rows([texts[0] for texts in expected])
        return
    assert not warned and not getattr(translator.processor, "with_syntax", False)
    if given == "object":
        assert translator.processor is None  # the tokenizer alone, as given
    with torch.no_grad():
        expected = model.generate(**tokenizer(sources, return_tensors="pt", padding=True))
    texts = [text.strip() for text in tokenizer.batch_decode(expected, skip_special_tokens=True)]
    assert translator(sources, batch_size=2) == rows(texts)


def test_num_return_sequences_gives_one_list_per_sentence(rhe_folder, rhe_translator, multi30k_processor, sources):
    _, model = rhe_folder
    settings = dict(num_beams=4, num_return_sequences=2)
    expected = generated(model, multi30k_processor, sources[:3], **settings)
    assert [len(texts) for texts in expected] == [2, 2, 2]
    nested = [rows(texts) for texts in expected]
    assert rhe_translator(sources[:3], **settings) == nested
    assert rhe_translator(sources[:3], batch_size=2, **settings) == nested
    assert rhe_translator(sources[0], **settings) == nested[0]


def test_inputs_that_are_not_sentences(rhe_translator, sources):
    import datasets

    assert rhe_translator([]) == []
    with pytest.raises(TypeError, match=r"translates strings.*got a int"):
        rhe_translator([sources[0], 3])
    with pytest.raises(TypeError, match=r"got a Dataset \(translate a dataset's text column: `dataset\['en'\]`"):
        rhe_translator(datasets.Dataset.from_dict({"en": sources}))


def test_remote_pipeline_from_every_save(tmp_path, multi30k_processor, tiny_config, sources):
    """A folder written by a plain `save_pretrained` (a model that reads no syntax and one that does) or by
    `Trainer.save_model` carries the pipeline's code and names it in `custom_pipelines`: in a process where
    `mgsa_hf` cannot be imported, `pipeline(model=folder, trust_remote_code=True)` translates as the registered
    pipeline does, and so does a folder the remote-code model and processor save again."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    plain = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=False)
    save_folder(tmp_path / "transformer", plain, tiny_config, "transformer")
    save_folder(tmp_path / "rhe", multi30k_processor, tiny_config, "rhe")
    model = MgsaForConditionalGeneration.from_pretrained(tmp_path / "rhe")
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "trainer"), report_to=[], use_cpu=True)
    Seq2SeqTrainer(model=model, args=arguments, processing_class=multi30k_processor).save_model(tmp_path / "trained")

    folders = [str(tmp_path / name) for name in ("transformer", "rhe", "trained")]
    for folder in folders:
        saved = json.loads((Path(folder) / "config.json").read_text())
        assert saved["custom_pipelines"]["mgsa-translation"]["impl"] == "pipeline_translation.MgsaTranslationPipeline"
        assert (Path(folder) / "pipeline_translation.py").exists()
    expected = {folder: pipeline("translation", model=folder, device="cpu")(sources) for folder in folders}

    script = f"""
import json, sys
sys.modules["mgsa_hf"] = None  # any import of the package fails
from transformers import pipeline
translations = {{}}
for folder in {folders!r}:
    translator = pipeline(model=folder, trust_remote_code=True, device="cpu")
    assert not type(translator).__module__.startswith("mgsa_hf"), type(translator).__module__
    translations[folder] = translator({sources!r})
translator.model.save_pretrained({str(tmp_path / "resaved")!r})
translator.processor.save_pretrained({str(tmp_path / "resaved")!r})
translations["resaved"] = pipeline(model={str(tmp_path / "resaved")!r}, trust_remote_code=True, device="cpu")(
    {sources!r})
print(json.dumps(translations))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote == {**expected, "resaved": expected[folders[-1]]}


def test_translate_script_decodes_with_the_generation_config(rhe_folder, multi30k_processor, sources, tmp_path):
    """`mgsa-hf translate` without generation options translates as `generate` with the folder's generation
    config (before, it decoded with beam 4 and up to 128 new tokens whatever the folder said)."""
    folder, model = rhe_folder
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n")
    command = [sys.executable, "-m", "mgsa_hf.cli", "translate", str(folder),
               "--input", str(tmp_path / "src.en"), "--output", str(tmp_path / "hyp.de"), "--batch-size", "2"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [texts[0] for texts in generated(model, multi30k_processor, sources)]
    assert (tmp_path / "hyp.de").read_text().splitlines() == expected
