"""Errors that name the file: what is wrong with a JSON file of a saved folder (the processor's and tokenizer's
settings, the tokenizer itself). Transformers fails on one with a bare `JSONDecodeError` or `UnicodeDecodeError`, and
the pipeline factory drops a processor that fails to load without a word; the loaders of this package call
[`check_json_files`] when a load fails, to say which file is damaged and where."""

import json
import os
from collections.abc import Iterable
from pathlib import Path


# the JSON files a processor and its tokenizer are loaded from (those a folder has)
PROCESSOR_JSON_FILES = ("processor_config.json", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json",
                        "added_tokens.json", "vocab.json")


class DamagedFileError(OSError):
    """A file of a saved folder that cannot be read as what it should be: the message names the file and the line
    (and column) where reading it failed; `__cause__` is the reader's own error."""


def utf8_error_line(data: bytes, error: UnicodeDecodeError) -> str:
    """Where `error` (raised decoding `data`) is: `"line N: not UTF-8 text (byte 0x.. at byte M of the line)"`."""
    line_start = data.rfind(b"\n", 0, error.start) + 1
    line = data.count(b"\n", 0, error.start) + 1
    return (f"line {line}: not UTF-8 text (byte {data[error.start]:#04x} at byte {error.start - line_start + 1} of "
            "the line)")


def check_json_file(path: str | os.PathLike) -> None:
    """Reads the JSON file `path` (UTF-8), and for `tokenizer.json` the tokenizer it holds.

    Raises:
        DamagedFileError: naming the file and the line (and column) where it stops being UTF-8 or JSON, or (for
            `tokenizer.json`) saying that the `tokenizers` library does not read it; raised from the reader's own
            error.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise DamagedFileError(f"{path} is damaged, {utf8_error_line(data, error)}.") from error
    except json.JSONDecodeError as error:
        raise DamagedFileError(f"{path} is damaged, line {error.lineno}, column {error.colno}: not valid JSON "
                               f"({error.msg}).") from error
    except RecursionError as error:
        raise DamagedFileError(f"{path} is damaged: JSON nested too deeply to read.") from error
    if path.name == "tokenizer.json":
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust library raises a bare `Exception`, naming the line and column
            raise DamagedFileError(f"{path} is damaged: the `tokenizers` library does not read it as a tokenizer "
                                   f"({error}).") from error


def check_json_files(paths: Iterable[str | os.PathLike | None]) -> None:
    """[`check_json_file`] for each of `paths` that is a file (`None` and missing paths are skipped)."""
    for path in paths:
        if path is not None and Path(path).is_file():
            check_json_file(path)


def check_processor_files(folder) -> None:
    """[`check_json_file`] for the processor's and tokenizer's JSON files of a local `folder` (none for a Hub id)."""
    if isinstance(folder, (str, os.PathLike)) and Path(folder).is_dir():
        check_json_files(Path(folder, name) for name in PROCESSOR_JSON_FILES)


def json_object_or_empty(path) -> dict:
    """The object of a JSON file; {} for one that is not a JSON object (the loading that follows names the
    problem)."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def check_weights_fit_model(model) -> None:
    """Refuses a model loaded from a local folder whose weights files hold under half of its weights: a folder whose
    `config.json` names another architecture than its weights (a Marian model's weights under a T5 `config.json`),
    which Transformers loads with the missing weights random, and a warning.

    Raises:
        ValueError: naming `config.json`'s `model_type` and the weights file, with a weight name of each side.
    """
    name = getattr(model, "name_or_path", None)
    if not name or not callable(getattr(model, "state_dict", None)):  # a model made here, or an onnxruntime one
        return
    folder = Path(name)
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if not folder.is_dir() or not (index.is_file() or single.is_file()):
        return
    if index.is_file():
        weights_file = index
        saved = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
    else:  # the names of a safetensors file's header: its length (8 bytes, little-endian), then JSON
        weights_file = single
        with open(single, "rb") as file:
            saved = set(json.loads(file.read(int.from_bytes(file.read(8), "little")))) - {"__metadata__"}
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
    saved |= {name.removeprefix(prefix) for name in saved}
    expected = list(model.state_dict())
    found = [name for name in expected if name in saved or name.removeprefix(prefix) in saved]
    if saved and len(found) < len(expected) / 2:
        missing = next(name for name in expected if name not in found)
        raise ValueError(
            f"{weights_file} holds {len(found)} of the {len(expected)} weights of the model that "
            f"{folder / 'config.json'} describes (model_type {model.config.model_type!r}): config.json names "
            f"another architecture than its weights (it expects {missing!r}, the file holds {min(saved)!r}, ...). "
            "Put back the config.json saved with these weights."
        )
