"""`mgsa-hf prepare`: a recipe's corpus, tokenizer and processed splits prepared before a launch
([`~mgsa_hf.training.corpus.prepare`]), one shard of them (`--shard I/N`), and the prepared folders the recipe no
longer uses removed (`--clean`)."""

import json
import os
import shutil
import time
from pathlib import Path


# the prepared folders (and what a stopped build leaves beside them) by their names' prefixes
PREPARED_PREFIXES = ("corpus-", "parsed-", "processed-")


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, or of the file `folder` (0 when it does not exist)."""
    if Path(folder).is_file():
        return Path(folder).stat().st_size
    total = 0
    # os.walk skips a folder that goes while it walks (a staging folder renamed into place), where rglob raises
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:  # removed while walking
                continue
    return total


def folders_in_use(config, processor) -> set[str]:
    """The names of the prepared folders `config`'s recipe reads (with `processor`, the one it prepared with)."""
    from .config import source_position_limit
    from .corpus import content_key, corpus_parts, parsed_parts, processed_parts

    corpus_key = content_key(corpus_parts(config))
    limit = source_position_limit(config)
    return {f"corpus-{corpus_key}", f"parsed-{content_key(parsed_parts(corpus_key, processor))}",
            f"processed-{content_key(processed_parts(config, corpus_key, processor, limit))}"}


def clean_prepared(config, processor) -> list[dict]:
    """Remove every prepared folder of `prepared_dir` that `config`'s recipe does not read (other corpora, vocabularies
    or settings; staging folders, shards and failure records of stopped builds); returns what was removed, with
    sizes. A `prepared_dir` shared by several recipes keeps only this one's."""
    from .corpus import prepared_dir

    root, keep = prepared_dir(config), folders_in_use(config, processor)
    removed = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.startswith(PREPARED_PREFIXES) or path.name in keep:
            continue
        size = folder_bytes(path)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        removed.append({"name": path.name, "mb": round(size / 2**20, 1)})
    return removed


def run_prepare(args) -> dict:
    """Entry point of `mgsa-hf prepare`: prepare a recipe's corpus, tokenizer and processed splits in this one
    process, with `--num-proc` workers, before `mgsa-hf train` (or `accelerate launch`) with the same recipe; with
    `--shard I/N` only that shard; with `--clean`, then remove what the recipe does not read."""
    from .config import _check_run_settings, load_train_config, validate_model_section
    from .corpus import prepare, prepared_dir
    from .shards import parse_shard

    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)
        config_path = None
    config = load_train_config(config_path, overrides)
    _check_run_settings(config)
    validate_model_section(config)
    started = time.perf_counter()
    shard = parse_shard(args.shard) if args.shard else None
    try:
        corpus, processor, processed = prepare(config, is_main=True, num_proc=args.num_proc, shard=shard, wait=False)
    except OSError as error:  # one that names no file (a full disk, in `datasets`' writers): the folder written
        if error.filename is not None:
            raise
        message = f"preparing the data in {prepared_dir(config)} failed: {error.strerror or error}"
        raise (OSError(error.errno, message) if error.errno else OSError(message)) from error
    summary = {"prepared_dir": str(prepared_dir(config)),
               "rows": {name: len(data) for name, data in processed.items()} if processed is not None else None,
               "parsed": processor.with_syntax, "seconds": round(time.perf_counter() - started, 1)}
    if shard is not None:
        summary["shard"] = args.shard
        summary["complete"] = processed is not None  # else: the other shards' jobs are still to finish
    if args.clean:
        summary["removed"] = clean_prepared(config, processor)
    print(json.dumps(summary, indent=2))
    return summary


def add_prepare_arguments(parser) -> None:
    """The command line of `mgsa-hf prepare`: the recipe as for `mgsa-hf train`, and `--num-proc`."""
    from .config import add_train_arguments, positive_int

    add_train_arguments(parser)
    parser.add_argument("--num-proc", type=positive_int, default=None,
                        help="worker processes that tokenize and parse (default: the recipe's `num_proc`, else 1)")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="make shard I of N (from 0) of the tokenized and parsed splits, one job a shard with "
                             "the same recipe and prepared_dir (e.g. on a CPU cluster); the last to finish joins "
                             "them")
    parser.add_argument("--clean", action="store_true",
                        help="then remove the prepared folders of prepared_dir that this recipe does not read (other "
                             "corpora, vocabularies or settings, and what stopped builds left); they are listed")
