"""The processed step made in shards (`mgsa_hf.training.shards`): shards made by separate processes join into exactly
the rows the unsharded step gives, under the same key; a shard alone leaves the corpus incomplete and says so."""

import json
from pathlib import Path

import pytest
from conftest import MULTI30K_DIR

from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.corpus import prepare
from mgsa_hf.training.shards import launch_shard, parse_shard


TINY = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"


def recipe(tmp_path, prepared, *overrides):
    return load_train_config(TINY, [f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'model'}",
                                    f"prepared_dir={tmp_path / prepared}", "model.encoder_type=rhe",
                                    "max_train_samples=45", "max_eval_samples=7", "max_test_samples=5", *overrides])


def test_shards_join_into_the_unsharded_rows(tmp_path):
    """Three shards, the first two made before the third: incomplete until the last, which joins them into the folder
    the unsharded step writes (same name), with the same rows in the same order; the shards' folder is gone."""
    _, _, whole = prepare(recipe(tmp_path, "whole"))
    for index in (2, 0):
        _, _, processed = prepare(recipe(tmp_path, "sharded"), shard=(index, 3), wait=False)
        assert processed is None
    _, _, joined = prepare(recipe(tmp_path, "sharded"), shard=(1, 3), wait=False)
    assert joined is not None
    for split in ("train", "validation", "test"):
        assert joined[split][:] == whole[split][:]
    names = sorted(path.name for path in (tmp_path / "sharded").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "whole").iterdir())
    folder = next((tmp_path / "sharded").glob("processed-*"))
    record = json.loads((folder / "prepared.json").read_text())
    assert record["shards"] == 3 and record["rows"]["train"] == 45
    assert [Path(file).parent.name for file in record["files"]["train"]] == [f"shard-{i}-of-3" for i in range(3)]
    # complete: a later shard job, or a run without shards, loads it as it is
    _, _, again = prepare(recipe(tmp_path, "sharded"), shard=(0, 3), wait=False)
    assert again["train"][:] == whole["train"][:]


def run_prepare_command(arguments, capsys) -> dict:
    """`mgsa-hf prepare ARGUMENTS` in this process; its printed summary."""
    from mgsa_hf.cli import main

    capsys.readouterr()
    main(["prepare", *arguments])
    printed = capsys.readouterr().out
    return json.loads(printed[printed.index("{"):])


def test_the_shard_command(tmp_path, capsys):
    """`mgsa-hf prepare --shard I/N` makes its shard and says whether the corpus is complete; a bad I/N is refused by
    the option's name."""
    overrides = [str(TINY), f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'model'}",
                 f"prepared_dir={tmp_path / 'prepared'}", "model.encoder_type=transformer", "max_train_samples=30",
                 "max_eval_samples=4", "max_test_samples=4"]
    summaries = [run_prepare_command([*overrides, "--shard", shard], capsys) for shard in ("1/2", "0/2")]
    assert [summary["complete"] for summary in summaries] == [False, True]
    assert summaries[1]["rows"] == {"train": 30, "validation": 4, "test": 4}
    for bad in ("2/2", "a/b", "1"):
        with pytest.raises(ValueError, match="--shard takes I/N"):
            parse_shard(bad)
    assert parse_shard("3/8") == (3, 8)


def test_a_launch_shards_only_when_the_recipe_says_so(tmp_path):
    """Without `prepare_in_shards` (or in one process) the main process prepares alone."""
    assert launch_shard(recipe(tmp_path, "p")) is None
    assert launch_shard(recipe(tmp_path, "p", "prepare_in_shards=true")) is None  # one process: nothing to share


def test_prepare_clean_removes_what_the_recipe_does_not_read(tmp_path, capsys):
    """`mgsa-hf prepare --clean`: after preparing, the folders of another vocabulary and a stopped build's staging
    folder are removed and listed; the recipe's own folders stay and load."""
    overrides = [str(TINY), f"data={MULTI30K_DIR}", f"output_dir={tmp_path / 'model'}",
                 f"prepared_dir={tmp_path / 'prepared'}", "model.encoder_type=transformer", "max_train_samples=30",
                 "max_eval_samples=4", "max_test_samples=4"]
    prepare(load_train_config(overrides[0], [*overrides[1:], "vocab_size=120", f"output_dir={tmp_path / 'other'}"]))
    (tmp_path / "prepared" / "processed-0123.staging-99999").mkdir()
    summary = run_prepare_command([*overrides, "--clean"], capsys)
    removed = sorted(entry["name"].split("-")[0] for entry in summary["removed"])
    assert removed == ["processed", "processed"]  # the other vocabulary's fields and the stopped build
    left = sorted(path.name.split("-")[0] for path in (tmp_path / "prepared").iterdir())
    assert left == ["corpus", "processed"]
    _, _, processed = prepare(load_train_config(overrides[0], overrides[1:]))
    assert len(processed["train"]) == 30
