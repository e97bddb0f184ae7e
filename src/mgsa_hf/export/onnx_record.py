"""The record of an ONNX generation folder's parts, checked before its graphs are loaded.

[`~mgsa_hf.export.onnx_generation.export_generation_onnx`] writes `onnx_record.json` last, once every graph is
written (and again after quantization): the SHA-256 of each graph file and of each external-data file beside it, the
SHA-256 of the folder's `config.json` and of its tokenizer files, and what the graphs were made from (the encoder
type, the backbone, a digest of the weights, the package version). [`verify_onnx_record`] refuses, by file name, a
graph whose bytes differ from the record (another export's decoder, another encoder type's encoder), a recorded file
that is gone, a graph file the record does not name, and a `config.json` or tokenizer file that is not the one
exported with the graphs. A folder without the record (exported by an earlier version) loads with a warning: its
graphs are not checked.
"""

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from ..weights_checksums import file_sha256


logger = logging.getLogger(__name__)

RECORD = "onnx_record.json"
RECORD_FORMAT = 1
# the files a graph is made of: the graph itself and the external data the exporter writes beside it
GRAPH_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data")
# the files that make the tokenizer the graphs' ids were made with (another model's gave wrong text without a word);
# `generation_config.json` and `processor_config.json` are settings a user may change
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "*.spm")


def tokenizer_files(folder: Path) -> list[str]:
    """The names of the tokenizer files in `folder` ([`TOKENIZER_FILES`]), sorted."""
    return sorted({path.name for pattern in TOKENIZER_FILES for path in folder.glob(pattern) if path.is_file()})


def graph_files(folder: Path) -> list[str]:
    """The names of the graph and external-data files in `folder` ([`GRAPH_SUFFIXES`]), sorted."""
    return sorted(path.name for path in folder.iterdir() if path.is_file() and path.name.endswith(GRAPH_SUFFIXES))


def weights_digest(model: torch.nn.Module) -> str:
    """The hex SHA-256 of `model`'s parameters and buffers (names, dtypes, shapes and values, in `state_dict`
    order): which weights the graphs were made from."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_onnx_record(folder: str | os.PathLike, model_fields: dict, quantized: str | None = None) -> Path:
    """
    Write `onnx_record.json` in `folder` for the graph files and `config.json` it holds, atomically (a temporary
    file renamed into place).

    Args:
        folder: the ONNX folder, its graphs and `config.json` written.
        model_fields: what the graphs were made from (`encoder_type`, `backbone`, `weights_sha256`, ...).
        quantized: the graphs' weight type when quantized (`"int8"`), else None.

    Returns:
        The record's path.
    """
    from .. import __version__

    folder = Path(folder)
    record = {
        "format": RECORD_FORMAT,
        "mgsa_hf_version": __version__,
        "model": {**model_fields, "config_sha256": file_sha256(folder / "config.json")},
        "quantized": quantized,
        "files": {name: file_sha256(folder / name) for name in graph_files(folder)},
        "tokenizer_files": {name: file_sha256(folder / name) for name in tokenizer_files(folder)},
    }
    temporary = folder / f".{RECORD}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, folder / RECORD)
    return folder / RECORD


def read_onnx_record(folder: str | os.PathLike) -> dict | None:
    """The record of `folder`, or None when it has none.

    Raises:
        ValueError: naming the file, when it is not the JSON mapping [`write_onnx_record`] writes.
    """
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is damaged: not valid JSON ({error}). Export the model again "
                         "(`mgsa-hf export onnx FOLDER OUT --overwrite`).") from None
    if not (isinstance(record, dict) and isinstance(record.get("files"), dict) and isinstance(record.get("model"),
                                                                                             dict)):
        raise ValueError(f"{path} is damaged: not the record of an export (it lacks `files` or `model`). Export the "
                         "model again (`mgsa-hf export onnx FOLDER OUT --overwrite`).")
    return record


def verify_onnx_record(folder: str | os.PathLike, graphs: dict[str, str]) -> list[str]:
    """
    Check the graph files and `config.json` of an ONNX folder against its `onnx_record.json`; returns the file
    names checked (none, with a warning, for a folder without a record).

    Args:
        folder: the ONNX folder.
        graphs: the graphs its manifest names (kind -> file name).

    Raises:
        ValueError: naming the file, when a graph the manifest names is not in the record, a recorded file is
            missing, a graph file of the folder is not in the record, a file's SHA-256 differs from the record's,
            or `config.json` (its encoder type, or its bytes) is not the one exported with the graphs.
    """
    folder = Path(folder)
    record = read_onnx_record(folder)
    if record is None:
        logger.warning("%s has no %s (exported by an earlier version of mgsa-hf): its graphs are loaded unchecked; "
                       "export the model again to have them checked.", folder, RECORD)
        return []
    path = folder / RECORD
    files = record["files"]
    advice = "export the model again (`mgsa-hf export onnx FOLDER OUT --overwrite`), or copy the whole export folder."
    for name in files:
        if Path(name).name != name:
            raise ValueError(f"{path} names {name!r}, which is not a file of the folder.")
    unrecorded = [name for name in graphs.values() if name not in files]
    unrecorded += [name for name in graph_files(folder) if name not in files and name not in unrecorded]
    if unrecorded:
        raise ValueError(f"{folder / unrecorded[0]} is not in {path}, which records the graphs exported as "
                         f"{', '.join(files)}: it was not written by that export. Move it out, or {advice}")
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder / missing[0]} is missing: {path} records it as part of the export: {advice}")
    config_path = folder / "config.json"
    saved_type = record["model"].get("encoder_type")
    try:
        config_type = json.loads(config_path.read_text(encoding="utf-8")).get("encoder_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        config_type = saved_type  # a missing or damaged config is named by its checksum below, or by its loader
    if config_type != saved_type:
        raise ValueError(f"{config_path} has encoder_type={config_type!r}, but the graphs of {folder} were exported "
                         f"from an encoder_type={saved_type!r} model ({path}): {advice}")
    tokenizer = record.get("tokenizer_files") or {}  # none in the records of earlier versions
    if not isinstance(tokenizer, dict) or any(Path(name).name != name for name in tokenizer):
        raise ValueError(f"{path} is damaged: `tokenizer_files` is not a mapping of file names. {advice}")
    for name, expected in [*files.items(), ("config.json", record["model"].get("config_sha256")), *tokenizer.items()]:
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name} is missing: {advice}")
        actual = file_sha256(folder / name)
        if actual != expected:
            raise ValueError(
                f"{folder / name} is not the file exported with the rest of {folder}: its SHA-256 is {actual}, "
                f"{RECORD} records {expected}. It comes from another export or was changed after exporting: "
                f"{advice}"
            )
    return [*files, "config.json", *tokenizer]
