"""A prepared corpus records each file's size and SHA-256 when it is completed (`mgsa_hf.training.file_records`); a
load refuses a file cut short, damaged or gone, naming it, in every step (corpus, parse, processed), in a shard
before the shards are joined, and in the run's tokenizer."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import MULTI30K_DIR

from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.corpus import prepare
from mgsa_hf.training.file_records import CHECKSUMS, file_digest
from mgsa_hf.training.ownership import run_folder


TINY = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"


def recipe(output_dir, *overrides):
    return load_train_config(TINY, [f"data={MULTI30K_DIR}", f"output_dir={output_dir}", "max_train_samples=40",
                                    "max_eval_samples=6", "max_test_samples=6", *overrides])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A run folder with its prepared corpus (the tiny recipe, RHE: corpus, parse and processed steps) and
    tokenizer, prepared once; each test damages a copy."""
    output_dir = tmp_path_factory.mktemp("prepared") / "model"
    prepare(recipe(output_dir, "model.encoder_type=rhe"))
    return run_folder(output_dir)


@pytest.fixture
def copy(prepared, tmp_path):
    """A copy of the prepared run folder; returns its output_dir and its `prepared/` folder."""
    output_dir = tmp_path / "model"
    shutil.copytree(prepared, run_folder(output_dir))
    return output_dir, run_folder(output_dir) / "prepared"


def flip_bit(path: Path) -> None:
    """Flip one bit in the middle of `path` (its size, and the pyarrow reader's checks, unchanged)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_the_record_names_every_listed_file(copy):
    """Every step's `prepared.json` records each of its files (relative to the folder) with its size and SHA-256."""
    _, root = copy
    for step in ("corpus-*", "parsed-*", "processed-*"):
        folder = only(root, step)
        record = json.loads((folder / "prepared.json").read_text())
        files = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
        assert sorted(record[CHECKSUMS]) == [name for name in files if name != "prepared.json"]
        for name, entry in record[CHECKSUMS].items():
            assert entry == {"size": (folder / name).stat().st_size, "sha256": file_digest(folder / name)}
        for names in record.get("files", {}).values():
            assert set(names) <= set(record[CHECKSUMS])


@pytest.mark.parametrize(("step", "damage", "message"), [
    ("processed-*", "flip", r"does not hold the bytes that were prepared: its SHA-256 is"),
    ("processed-*", "truncate", r"holds \d+ bytes, .*prepared.json records \d+"),
    ("processed-*", "remove", r"is missing: .*prepared.json records it"),
    ("corpus-*", "flip", r"does not hold the bytes that were prepared"),
])
def test_a_damaged_prepared_file_is_refused_by_name(copy, step, damage, message):
    """A bit flipped in an Arrow file read as a token id of 4294967304 ("use the model's own tokenizer"), and a file
    cut short as pyarrow's "Expected to be able to read N bytes", naming no file: now the load names the file and
    says to prepare the folder again."""
    output_dir, root = copy
    folder = only(root, step)
    path = sorted(folder.rglob("*.arrow"))[0]
    if damage == "flip":
        flip_bit(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        path.unlink()
    with pytest.raises(ValueError, match=message) as error:
        prepare(recipe(output_dir, "model.encoder_type=rhe"))
    assert str(path) in str(error.value) and "prepare it again" in str(error.value)


def test_a_damaged_parse_is_refused_by_name(copy):
    """The parse step (`parsed-<key>`) is read when the processed step is made: a damaged parse is refused too."""
    output_dir, root = copy
    shutil.rmtree(only(root, "processed-*"))
    path = only(only(root, "parsed-*"), "train*.arrow")
    flip_bit(path)
    with pytest.raises(ValueError, match="does not hold the bytes that were prepared") as error:
        prepare(recipe(output_dir, "model.encoder_type=rhe"))
    assert str(path) in str(error.value)


def test_a_damaged_tokenizer_is_refused_by_name(copy):
    """The run's tokenizer records its files in `trained_for.json`: a damaged `tokenizer.json` is refused."""
    output_dir, _ = copy
    path = run_folder(output_dir) / "tokenizer" / "tokenizer.json"
    path.write_text(path.read_text().replace('"unk_id":0', '"unk_id":1', 1) + " ")
    with pytest.raises(ValueError, match="tokenizer.json holds .* bytes.*remove the folder to train it again"):
        prepare(recipe(output_dir, "model.encoder_type=rhe"))


def test_a_folder_prepared_before_the_record_loads_unchecked(copy):
    """A folder whose record has no checksums (prepared by an earlier version) loads as before."""
    output_dir, root = copy
    for record in root.glob("*/prepared.json"):
        written = json.loads(record.read_text())
        del written[CHECKSUMS]
        record.write_text(json.dumps(written))
    _, _, processed = prepare(recipe(output_dir, "model.encoder_type=rhe"))
    assert len(processed["train"]) == 40


def test_a_shard_damaged_before_the_join_is_refused(tmp_path):
    """The process that joins the shards checks each shard's files against its record first: a damaged shard is
    named, and the folder is not declared complete."""
    config = recipe(tmp_path / "model", "model.encoder_type=transformer", f"prepared_dir={tmp_path / 'prepared'}")
    _, _, processed = prepare(config, shard=(0, 2), wait=False)
    assert processed is None
    shards = only(tmp_path / "prepared", "processed-*.shards")
    record = json.loads((shards / "shard-0-of-2.json").read_text())
    assert sorted(record[CHECKSUMS]) == sorted(name for names in record["files"].values() for name in names)
    path = shards / record["files"]["train"][0]
    flip_bit(path)
    with pytest.raises(ValueError, match="does not hold the bytes that were prepared") as error:
        prepare(config, shard=(1, 2), wait=False)
    assert str(path) in str(error.value)
    assert not list((tmp_path / "prepared").glob("processed-*/prepared.json"))
