"""Shared fixtures, and where the tests find the project's data."""

import os
import types
from pathlib import Path

import pytest
import torch

from mgsa_hf.tokenization_utils import read_lines


def pytest_configure(config):
    """In a pytest-xdist worker, torch and the processes a test starts use the worker's share of the cores, so that
    the workers together start no more threads than there are cores."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)


# the project's data: `MGSA_HF_DATA` (a folder holding `multi30k/` and `ptb-wsj-sample/`), else `../shared/data` beside
# the checkout (docs/getting-started.md, "The data"); without it the tests that read it are skipped
REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("MGSA_HF_DATA") or REPO.parent / "shared" / "data").resolve()
MULTI30K_DIR = DATA_ROOT / "multi30k"
MULTI30K = str(MULTI30K_DIR)
PTB_DIR = DATA_ROOT / "ptb-wsj-sample"
MISSING_DATA_REASON = (f"needs the project's data ({DATA_ROOT} has no multi30k/ or ptb-wsj-sample/): set "
                       "MGSA_HF_DATA to the folder holding them, or put ../shared/data beside the checkout")
# the sizes of the tests' tiny Marian-backbone models (32 wide, 2 + 1 layers, 4 heads, no dropout)
TINY_SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128, init_std=0.2, dropout=0.0,
                  attention_dropout=0.0)


def _data_paths_missing() -> bool:
    return not (MULTI30K_DIR.is_dir() and PTB_DIR.is_dir())


def _holds_data_path(value) -> bool:
    if isinstance(value, (str, Path)):
        return str(value).startswith(str(DATA_ROOT))
    if isinstance(value, (list, tuple)):
        return any(_holds_data_path(item) for item in value)
    return False


def _nested_code(code: types.CodeType):
    """`code` and the code objects inside it (its functions, lambdas and comprehensions), at any depth."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested_code(constant)


def _reaches_data(function, seen: set, fixture_functions) -> bool:
    """Whether `function` (a test, a fixture or a helper), or a function of the tests' own that it calls or a fixture
    it asks for by name (`request.getfixturevalue("name")`), reads a module-level name holding a path of the
    project's data (read from the code's names, nothing is run)."""
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    for name in (constant for part in _nested_code(code) for constant in part.co_consts if isinstance(constant, str)):
        if any(_reaches_data(fixture, seen, fixture_functions) for fixture in fixture_functions(name)):
            return True
    for name in (name for part in _nested_code(code) for name in part.co_names):
        value = function.__globals__.get(name)
        if _holds_data_path(value):
            return True
        if isinstance(value, types.FunctionType) and Path(value.__code__.co_filename).is_relative_to(REPO / "tests"):
            if _reaches_data(value, seen, fixture_functions):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    """Without the project's data, skip (with the reason saying what to set) the tests that read it: the test, its
    fixtures, or a helper of the tests they call, names a path under the data folder."""
    if not _data_paths_missing():
        return
    skip = pytest.mark.skip(reason=MISSING_DATA_REASON)
    manager = config.pluginmanager.get_plugin("funcmanage")
    for item in items:
        def fixture_functions(name, item=item):
            if not name.isidentifier():
                return []
            return [definition.func for definition in manager.getfixturedefs(name, item) or ()]

        seen = set()
        fixtures = [definition.func for definitions in item._fixtureinfo.name2fixturedefs.values()
                    for definition in definitions]
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (any(_holds_data_path(value) for value in params.values())
                or any(_reaches_data(function, seen, fixture_functions) for function in [item.function, *fixtures])
                or any(_reaches_data(function, seen, fixture_functions)
                       for value in params.values() if isinstance(value, str)
                       for function in fixture_functions(value))):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def one_torchlib_registry():
    """`torch.onnx.export` builds its operator registry from onnxscript's torchlib at every call (about a second on
    one core, three calls per exported model): the exports of a test process share one per opset (use it with
    `pytestmark = pytest.mark.usefixtures("one_torchlib_registry")`). Without the private name
    (another torch), every export builds its own."""
    try:
        from torch.onnx._internal.exporter import _registration

        build = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__
    except (ImportError, KeyError, AttributeError):
        yield
        return
    registries = {}

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in registries:
            registries[key] = build(cls, *args, **kwargs)
        return registries[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(from_torchlib))
        yield


@pytest.fixture(scope="module")
def uncached_fake_tensors():
    """`torch.export` caches its operators' fake outputs, but rebuilding a cached output of dynamic shape costs more
    than running the operator's meta function again: a test module's exports run without that cache (a sixth to a
    third less time for an export; the same operators, a few shape values named otherwise; use it with
    `pytestmark = pytest.mark.usefixtures("uncached_fake_tensors")`)."""
    import torch._dynamo.config

    if not hasattr(torch._dynamo.config, "fake_tensor_cache_enabled"):  # another torch: its own default
        yield
        return
    with torch._dynamo.config.patch(fake_tensor_cache_enabled=False):
        yield


# Exporting a model traces three graphs with `torch.export`, decomposes and optimizes them: 15 to 50 s of one core
# per kind, most of it per graph whatever the width; one encoder layer (layer 0, where every variant sits by default)
# and one decoder layer take a tenth off the tests' tiny models (2 + 1 Marian, 2 + 2 T5 layers)
ONNX_EXPORT_LAYERS = {"marian": {"encoder_layers": 1, "decoder_layers": 1},
                      "t5": {"num_layers": 1, "num_decoder_layers": 1}}


def cli_error(argv) -> str:
    """The one line `mgsa-hf` ends with for `argv` (a user error), checked to be one line without a traceback."""
    from mgsa_hf.cli import main

    with pytest.raises(SystemExit) as stopped:
        main([str(arg) for arg in argv])
    message = str(stopped.value.code)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.fixture(scope="session")
def onnx_transformer(tmp_path_factory, worker_id, multi30k_processor, tiny_config):
    """A tiny random Transformer (`init_std` 0.2, seed 0, `ONNX_EXPORT_LAYERS`) saved with its processor and exported
    by `mgsa-hf export onnx`: `(model folder, ONNX folder)`. Exported once in a test run: the xdist workers share
    the folders (the first worker that needs them writes them, under a file lock; the tokenizer is trained
    deterministically, so every worker's processor is the saved one). Tests read them and change copies."""
    import contextlib
    import io

    from filelock import FileLock

    from mgsa_hf import MgsaForConditionalGeneration
    from mgsa_hf.cli import main

    # the run's own folder: the workers' common parent under xdist, this process's base folder without it
    run_root = tmp_path_factory.getbasetemp()
    root = (run_root if worker_id == "master" else run_root.parent) / "onnx-transformer"
    with FileLock(f"{root}.lock"):
        if not (root / "onnx" / "onnx_record.json").is_file():  # the record is written last
            torch.manual_seed(0)
            config = tiny_config(multi30k_processor, "transformer", init_std=0.2, **ONNX_EXPORT_LAYERS["marian"])
            MgsaForConditionalGeneration(config).save_pretrained(root / "model")
            multi30k_processor.save_pretrained(root / "model")
            with contextlib.redirect_stdout(io.StringIO()):
                main(["export", "onnx", str(root / "model"), str(root / "onnx")])
    return root / "model", root / "onnx"


def onnx_kinds(names) -> list[str]:
    """The ONNX export kinds a test module runs: all of `names`, or those that `MGSA_ONNX_KINDS` lists
    (comma-separated; CI's lowest-versions pass exports a few, every one runs at the newest versions)."""
    chosen = os.environ.get("MGSA_ONNX_KINDS")
    if not chosen:
        return list(names)
    wanted = {name.strip() for name in chosen.split(",")}
    return [name for name in names if name in wanted]


def assert_ort_generate_equals_pytorch(model, ort_model, batch, max_new_tokens: int, **settings) -> None:
    """`ort_model.generate` gives `model.generate`'s sequences and, at every step (from the cache after the first),
    its scores, with `settings` (beams, `num_return_sequences`); the scores must vary, so the check is not vacuous."""
    generate = dict(max_new_tokens=max_new_tokens, do_sample=False, output_scores=True, return_dict_in_generate=True,
                    **settings)
    with torch.no_grad():
        expected = model.generate(**batch, **generate)
    actual = ort_model.generate(**batch, **generate)
    rows = batch["input_ids"].shape[0] * settings.get("num_return_sequences", 1)
    assert actual.sequences.shape == expected.sequences.shape == (rows, max_new_tokens + 1)
    assert torch.equal(actual.sequences, expected.sequences)
    assert len(actual.scores) == len(expected.scores) == max_new_tokens
    for actual_scores, expected_scores in zip(actual.scores, expected.scores, strict=True):
        torch.testing.assert_close(actual_scores, expected_scores, atol=1e-4, rtol=1e-4)
    finite = torch.cat([scores[scores.isfinite()] for scores in expected.scores])
    assert finite.std() > 0.1


def tiny_sizes(**overrides) -> dict:
    """[`TINY_SIZES`] with `overrides` (a vocabulary, special tokens, other sizes): the fields of a test's tiny
    `MgsaConfig` / `MarianConfig`."""
    return {**TINY_SIZES, **overrides}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest, and steadiest on a shared machine, on one thread (use it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def multi30k_processor(tmp_path_factory):
    """An `MgsaProcessor` with a small joint subword vocabulary trained on the start of Multi30k train (Marian
    special tokens: `</s>` 0, `<unk>` 1, `<pad>` 2)."""
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(
        f"{MULTI30K}/train.en.gz",
        f"{MULTI30K}/train.de.gz",
        tmp_path_factory.mktemp("multi30k_tokenizer"),
        vocab_size=600,
        max_sentences=1000,
    )
    return MgsaProcessor(tokenizer)


@pytest.fixture(scope="session")
def multi30k_val():
    """The first 16 (English, German) sentence pairs of Multi30k val."""
    return list(read_lines(f"{MULTI30K}/val.en.gz", 16)), list(read_lines(f"{MULTI30K}/val.de.gz", 16))


@pytest.fixture(scope="session")
def multi30k_train_sources():
    """The first 500 English sentences of Multi30k train."""
    return list(read_lines(f"{MULTI30K}/train.en.gz", 500))


@pytest.fixture(scope="session")
def marian_processor(tmp_path_factory):
    """An `MgsaProcessor` around a `MarianTokenizer` (SentencePiece, returns no offsets), trained like the
    `multi30k_processor` one."""
    from mgsa_hf.processing_mgsa import MgsaProcessor
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(
        f"{MULTI30K}/train.en.gz",
        f"{MULTI30K}/train.de.gz",
        tmp_path_factory.mktemp("marian_tokenizer"),
        vocab_size=600,
        max_sentences=1000,
        tokenizer_type="marian",
    )
    return MgsaProcessor(tokenizer)


@pytest.fixture(scope="session")
def tiny_config():
    """Factory of tiny `MgsaConfig`s (32 wide, 2+1 layers) for a processor's vocabulary and phrase tags:
    `tiny_config(processor, encoder_type, **fields)`, `fields` overriding sizes and setting variant fields."""
    from mgsa_hf import MgsaConfig

    def make(processor, encoder_type: str, **fields) -> MgsaConfig:
        tokenizer = processor.tokenizer
        sizes = {key: value for key, value in TINY_SIZES.items() if key not in ("init_std", "dropout",
                                                                               "attention_dropout")}
        return MgsaConfig(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
            decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            encoder_type=encoder_type, num_phrase_tags=len(processor.phrase_tags), **{**sizes, **fields},
        )

    return make


@pytest.fixture(scope="session")
def tiny_t5_config():
    """Factory of tiny `MgsaT5Config`s (32 wide, 2 + 2 blocks, d_kv 8) for a processor's vocabulary and phrase tags:
    `tiny_t5_config(processor, encoder_type, **fields)`, `fields` overriding sizes and setting variant fields."""
    from mgsa_hf import MgsaT5Config

    def make(processor, encoder_type: str, **fields) -> MgsaT5Config:
        tokenizer = processor.tokenizer
        sizes = dict(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                     relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0)
        return MgsaT5Config(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id, encoder_type=encoder_type,
            num_phrase_tags=len(processor.phrase_tags), **{**sizes, **fields},
        )

    return make
