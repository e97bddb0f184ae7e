"""An ONNX folder hangs together or is refused: `mgsa-hf export onnx` records its parts (`onnx_record.json`: the
SHA-256 of each graph and of `config.json`, the encoder type, the weights' digest, the package version), and loading
refuses by name another export's graph, a missing or extra graph and another encoder type's config; a damaged
`generation_config.json` and a translation past the positions get the PyTorch path's errors; `mgsa-hf evaluate`
takes the ONNX folder `translate` takes; the commands' advice for a processor that names code is their own
`--trust-remote-code`. One tiny random Transformer is exported, once in a test run."""

import contextlib
import io
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration
from mgsa_hf.cli import main


pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from mgsa_hf.export.onnx_generation import OrtMgsaForConditionalGeneration, load_model_and_processor  # noqa: E402
from mgsa_hf.export.onnx_record import RECORD, weights_digest  # noqa: E402
from mgsa_hf.weights_checksums import file_sha256  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread", "one_torchlib_registry", "uncached_fake_tensors")

GRAPHS = ["decoder_model.onnx", "decoder_with_past_model.onnx", "encoder_model.onnx"]
SOURCES = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.",
           "A little girl climbs into a wooden playhouse.", "A woman sings on stage."]
REFERENCES = ["Ein Mann in einem blauen Hemd steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.",
              "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "Eine Frau singt auf der Bühne."]
CODE_SETTING = {"tree_parser": "tree_plugins:flat_np_tree"}  # tests/tree_plugins.py, importable from the tests


@pytest.fixture(scope="module")
def exported(onnx_transformer):
    """A tiny random Transformer saved with its processor and exported by `mgsa-hf export onnx` (the `conftest`
    fixture, shared with test_onnx_generation.py): `(model, model folder, ONNX folder)`."""
    model_folder, onnx_folder = onnx_transformer
    return MgsaForConditionalGeneration.from_pretrained(model_folder).eval(), model_folder, onnx_folder


def copy_of(folder: Path, target: Path, **processor_settings) -> Path:
    """A copy of `folder`, its `processor_config.json` updated with `processor_settings`."""
    shutil.copytree(folder, target)
    if processor_settings:
        path = target / "processor_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **processor_settings}))
    return target


def another_export(graph: Path, target: Path) -> None:
    """Write at `target` the graph of `graph` with other weights (its largest initializer shifted): what another
    export of the same architecture writes."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(graph)
    initializer = max(proto.graph.initializer, key=lambda tensor: int(np.prod(tensor.dims)))
    shifted = numpy_helper.to_array(initializer) + 0.5
    initializer.CopyFrom(numpy_helper.from_array(shifted, initializer.name))
    onnx.save(proto, target)


def test_the_record_names_every_part(exported):
    model, _, folder = exported
    record = json.loads((folder / RECORD).read_text())
    assert sorted(record["files"]) == GRAPHS
    assert all(record["files"][name] == file_sha256(folder / name) for name in GRAPHS)
    assert record["model"]["config_sha256"] == file_sha256(folder / "config.json")
    assert record["model"]["encoder_type"] == "transformer"
    assert record["model"]["backbone"] == "MgsaForConditionalGeneration"
    assert record["model"]["weights_sha256"] == weights_digest(model)
    assert record["mgsa_hf_version"] and record["quantized"] is None
    assert not list(folder.glob(f".{RECORD}*"))  # the temporary file was renamed into place


def test_another_exports_graph_is_refused_by_name(exported, tmp_path, caplog):
    _, _, folder = exported
    mixed = copy_of(folder, tmp_path / "mixed")
    another_export(folder / "decoder_model.onnx", mixed / "decoder_model.onnx")
    another_export(folder / "decoder_with_past_model.onnx", mixed / "decoder_with_past_model.onnx")
    with pytest.raises(ValueError, match=r"decoder_model\.onnx is not the file exported with the rest"):
        OrtMgsaForConditionalGeneration.from_pretrained(mixed, threads=1)
    # the graphs themselves load: without the record the mix would decode, with a warning only
    (mixed / RECORD).unlink()
    with caplog.at_level(logging.WARNING, logger="mgsa_hf.export.onnx_record"):
        OrtMgsaForConditionalGeneration.from_pretrained(mixed, threads=1)
    assert f"has no {RECORD}" in caplog.text and "unchecked" in caplog.text


def test_another_encoder_graph_or_encoder_type_is_refused(exported, tmp_path):
    _, _, folder = exported
    swapped = copy_of(folder, tmp_path / "encoder")
    shutil.copyfile(folder / "decoder_model.onnx", swapped / "encoder_model.onnx")
    with pytest.raises(ValueError, match=r"encoder_model\.onnx is not the file exported"):
        OrtMgsaForConditionalGeneration.from_pretrained(swapped, threads=1)
    retyped = copy_of(folder, tmp_path / "config")
    config = json.loads((retyped / "config.json").read_text())
    (retyped / "config.json").write_text(json.dumps({**config, "encoder_type": "hybrid"}))
    with pytest.raises(ValueError, match=r"config\.json has encoder_type='hybrid'.*encoder_type='transformer'"):
        OrtMgsaForConditionalGeneration.from_pretrained(retyped, threads=1)
    (retyped / "config.json").write_text(json.dumps({**config, "eos_token_id": 1}))  # decoding would change
    with pytest.raises(ValueError, match=r"config\.json is not the file exported"):
        OrtMgsaForConditionalGeneration.from_pretrained(retyped, threads=1)


def test_a_missing_or_extra_graph_is_refused_by_name(exported, tmp_path):
    _, _, folder = exported
    missing = copy_of(folder, tmp_path / "missing")
    (missing / "decoder_with_past_model.onnx").unlink()
    with pytest.raises(ValueError, match=r"decoder_with_past_model\.onnx is missing"):
        OrtMgsaForConditionalGeneration.from_pretrained(missing, threads=1)
    extra = copy_of(folder, tmp_path / "extra")
    (extra / "encoder_model.onnx.data").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=rf"encoder_model\.onnx\.data is not in .*{RECORD}"):
        OrtMgsaForConditionalGeneration.from_pretrained(extra, threads=1)
    damaged = copy_of(folder, tmp_path / "damaged")
    (damaged / RECORD).write_text((folder / RECORD).read_text()[:40])
    with pytest.raises(ValueError, match=rf"{RECORD} is damaged"):
        OrtMgsaForConditionalGeneration.from_pretrained(damaged, threads=1)


def test_a_damaged_generation_config_is_refused(exported, tmp_path):
    """As `from_pretrained` of the model folder refuses it, instead of decoding with default settings."""
    _, model_folder, folder = exported
    damaged = copy_of(folder, tmp_path / "onnx")
    text = (damaged / "generation_config.json").read_text()
    (damaged / "generation_config.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"generation_config\.json is damaged"):
        OrtMgsaForConditionalGeneration.from_pretrained(damaged, threads=1)
    (tmp_path / "source.en").write_text(SOURCES[0] + "\n")
    with pytest.raises(SystemExit, match=r"^mgsa-hf translate: error: .*generation_config\.json is damaged"):
        main(["translate", str(damaged), "--input", str(tmp_path / "source.en"), "--threads", "1"])


def test_positions_past_the_limit_get_pytorchs_errors(exported, multi30k_processor):
    model, _, folder = exported
    ort_model = OrtMgsaForConditionalGeneration.from_pretrained(folder, threads=1)
    batch = multi30k_processor(SOURCES[:2], return_tensors="pt")
    positions = model.config.max_position_embeddings
    for settings in ({"max_new_tokens": positions + 1}, {"max_length": positions + 2}):
        with pytest.raises(ValueError, match="beyond the model's positions") as expected:
            model.generate(**batch, **settings)
        with pytest.raises(ValueError, match="beyond the model's positions") as actual:
            ort_model.generate(**batch, **settings)
        assert str(actual.value) == str(expected.value)
    ort_model.generation_config.max_length = positions + 2
    with pytest.raises(ValueError, match=r"`model\.generation_config\.max_length` = 130 is beyond"):
        ort_model.generate(**batch)
    # a step's own tokens: the error the PyTorch forward gives, not an index error inside the graph
    long_target = torch.full((2, positions + 1), 5)
    for source, target in ((batch["input_ids"], long_target), (torch.full((2, positions + 2), 5), long_target[:, :2])):
        mask = torch.ones_like(source)
        with pytest.raises(ValueError, match="max_position_embeddings") as expected:
            model(input_ids=source, attention_mask=mask, decoder_input_ids=target)
        with pytest.raises(ValueError, match="max_position_embeddings") as actual:
            ort_model(input_ids=source, attention_mask=mask, decoder_input_ids=target)
        assert str(actual.value) == str(expected.value)


def test_evaluate_takes_the_onnx_folder_translate_takes(exported, tmp_path):
    """`mgsa-hf evaluate` of the ONNX folder reports what it reports for the model folder (the graphs compute the
    model's tokens)."""
    _, model_folder, folder = exported
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "mini.en").write_text("\n".join(SOURCES) + "\n")
    (corpus / "mini.de").write_text("\n".join(REFERENCES) + "\n")
    reports = {}
    for name, path in (("pytorch", model_folder), ("onnx", folder)):
        with contextlib.redirect_stdout(io.StringIO()):
            main(["evaluate", str(path), "--data", str(corpus), "--split", "mini", "--num-beams", "2", "--threads",
                  "1", "--output", str(tmp_path / f"{name}.json")])
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert reports["onnx"].pop("folder") == str(folder)
    assert reports["pytorch"].pop("folder") == str(model_folder)
    assert reports["onnx"] == reports["pytorch"]
    assert reports["onnx"]["sentences"] == len(SOURCES) and reports["onnx"]["chrf"] > 0


def test_the_commands_advice_for_saved_code_is_their_flag(exported, tmp_path):
    """translate, evaluate and export onnx refuse a processor that names code with `--trust-remote-code`, an option
    they have (not `trust_remote_code=True`); with it they load it."""
    _, model_folder, folder = exported
    hostile_onnx = copy_of(folder, tmp_path / "onnx", **CODE_SETTING)
    hostile_model = copy_of(model_folder, tmp_path / "model", **CODE_SETTING)
    (tmp_path / "source.en").write_text(SOURCES[1] + "\n")
    (tmp_path / "source.de").write_text(REFERENCES[1] + "\n")
    translate = ["--input", str(tmp_path / "source.en"), "--threads", "1", "--max-new-tokens", "4"]
    commands = {
        "translate": [["translate", str(hostile_onnx), *translate], ["translate", str(hostile_model), *translate]],
        "evaluate": [["evaluate", str(hostile_onnx), "--data", str(tmp_path), "--split", "source", "--threads", "1"]],
        "export": [["export", "onnx", str(hostile_model), str(tmp_path / "out")]],
    }
    for command, calls in commands.items():
        for arguments in calls:
            with pytest.raises(SystemExit) as refused:
                main(arguments)
            message = str(refused.value.code)
            assert message.startswith(f"mgsa-hf {command}: error: ") and "tree_parser='tree_plugins:flat_np_tree'" \
                in message, message
            assert "pass `--trust-remote-code`" in message and "trust_remote_code=True" not in message, message
    assert not (tmp_path / "out").exists()
    for arguments in commands["translate"]:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            main([*arguments, "--trust-remote-code"])
        assert len(printed.getvalue().splitlines()) == 1
    _, processor, _ = load_model_and_processor(hostile_model, None, trust_remote_code=True)
    assert processor.tree_parser == CODE_SETTING["tree_parser"]
