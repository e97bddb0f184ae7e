"""A record of the weights a saved folder holds, checked when the folder is loaded.

`save_pretrained` writes `weights.sha256` beside the weights: the SHA-256 of every weights file
(`model*.safetensors` and a sharded save's index) in `sha256sum`'s format, so `sha256sum -c weights.sha256` checks a
folder too. Every read of a local folder that has the record checks it (`from_pretrained`, resuming the Trainer from
a checkpoint, checkpoint averaging) and refuses, by name, a weights file whose bytes changed, a file the record names
that is gone, and a weights file it does not name; a folder without it (saved before the record, or an opus-mt / T5
one) loads as before. safetensors checks the header of a file, not its data: a flipped bit in a weight otherwise
loads silently.

The whole save is written beside the folder and swapped in when complete (`atomic_saves.staged_folder`): a save
that stops leaves the folder as it was, and a folder never holds the weights of two saves.

The tokenizer a model was trained with is recorded in its config (`tokenizer_vocabulary` in `config.json`, set by
[`record_tokenizer`] where the package builds or converts a model): the number of tokens and the SHA-256 of the
token -> id map, and of the pieces of a SentencePiece tokenizer's model files. Loading a folder's processor or
tokenizer with its model ([`check_tokenizer_record`]) refuses another model's tokenizer copied into the folder, by
name. The vocabulary, not the files' bytes, is the identity: a tokenizer saved again (another transformers release,
another `model_max_length`) maps text to the same ids and keeps loading, another run's maps it to other ids.
"""

import hashlib
import json
import os
from pathlib import Path

from .atomic_saves import MODEL_FILES, staged_folder


CHECKSUMS_NAME = "weights.sha256"
# what `save_pretrained` writes: a file per shard (`variant` before the suffix) and, when sharded, their index
WEIGHTS_PATTERNS = ("model*.safetensors", "model*.safetensors.index.json")
CHUNK_SIZE = 1 << 22  # 4 MiB


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    return digest.hexdigest()


def weights_files(folder: Path) -> list[str]:
    """The names of the weights files in `folder` ([`WEIGHTS_PATTERNS`]), sorted."""
    return sorted({path.name for pattern in WEIGHTS_PATTERNS for path in folder.glob(pattern) if path.is_file()})


def write_weights_checksums(folder: str | os.PathLike) -> Path | None:
    """Write `weights.sha256` in `folder` for the weights files it holds; returns its path, or None (and removes an
    earlier record) when the folder holds no weights file."""
    folder = Path(folder)
    names = weights_files(folder)
    record = folder / CHECKSUMS_NAME
    if not names:
        record.unlink(missing_ok=True)
        return None
    record.write_text("".join(f"{file_sha256(folder / name)}  {name}\n" for name in names), encoding="utf-8")
    return record


def read_weights_checksums(record: Path) -> dict[str, str]:
    """File name -> hex SHA-256, from a `weights.sha256` record (`sha256sum`'s `<digest>  <name>` lines; a `*`
    before the name, binary mode, is accepted)."""
    try:
        text = record.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{record} is not a `sha256sum` record (not UTF-8 text: {error}); it was damaged: save the "
                         "model again, or delete the file to load the folder unchecked.") from None
    checksums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, separator, name = line.partition(" ")
        name = name.lstrip(" *")
        if not separator or len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise ValueError(f"{record}, line {number}: not a `<sha256>  <file name>` line: {line!r}.")
        checksums[name] = digest.lower()
    return checksums


def verify_weights_checksums(folder: str | os.PathLike) -> list[str]:
    """Check the weights files of a saved `folder` against its `weights.sha256` record; returns the names checked
    (none when the folder has no record).

    Raises:
        ValueError: naming the file, when a file the record names is missing, a weights file of the folder is not in
        the record (a loader would read it unchecked: a record naming only a missing shard let a damaged
        `model.safetensors` load), or a file's SHA-256 differs from the record's.
    """
    folder = Path(folder)
    record = folder / CHECKSUMS_NAME
    if not record.is_file():
        return []
    checksums = read_weights_checksums(record)
    for name in checksums:
        if Path(name).name != name:
            raise ValueError(f"{record} names {name!r}, which is not a file of the folder.")
    advice = "save or download the folder again, or delete the record to load it unchecked."
    missing = [name for name in checksums if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder / missing[0]} is missing: {CHECKSUMS_NAME} records the weights saved as "
                         f"{', '.join(checksums)}. The folder does not hold the weights that were saved: {advice}")
    unlisted = [name for name in weights_files(folder) if name not in checksums]
    if unlisted:
        raise ValueError(f"{folder / unlisted[0]} is not in {record}, which records the weights saved as "
                         f"{', '.join(checksums) or 'no file'}: it was not written by that save. Move it out, or "
                         f"{advice}")
    for name, expected in checksums.items():
        actual = file_sha256(folder / name)
        if actual != expected:
            raise ValueError(
                f"{folder / name} does not hold the weights that were saved: its SHA-256 is {actual}, "
                f"{CHECKSUMS_NAME} records {expected}. The file was changed or damaged after saving: save or download "
                "it again."
            )
    return list(checksums)


def check_generation_config(folder: str | os.PathLike) -> None:
    """Transformers loads a model without its `generation_config.json` when that file cannot be read, and decodes
    with defaults instead (greedy, 20 new tokens) without a word: a damaged one is refused here.

    Raises:
        ValueError: naming the file, when it is not a JSON mapping.
    """
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        settings = error
    if not isinstance(settings, dict):
        problem = f"not valid JSON ({settings})" if isinstance(settings, Exception) else "not a JSON mapping"
        raise ValueError(f"{path} is damaged: {problem}. Loaded without it, the model would decode with default "
                         "settings; save the model again, or delete the file to decode with the model config's.")


class WeightsChecksumMixin:
    """`save_pretrained` records the SHA-256 of the weights it wrote (`weights.sha256`) and swaps the whole save into
    its folder at once (the folder's other files kept, the earlier save's weights not), `from_pretrained` of a local
    folder checks the weights and refuses a damaged `generation_config.json`. Every way of saving goes through
    `save_pretrained`: `Trainer.save_model`, the Trainer's checkpoints, sharded saves, `push_to_hub` (which saves into
    a temporary folder and uploads it whole)."""

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        if push_to_hub:
            # Transformers uploads before this method's record would be written: save, then push what was saved
            repo_id = kwargs.pop("repo_id", Path(save_directory).name)
            hub_options = {name: kwargs.pop(name) for name in ("commit_message", "create_pr", "private")
                           if name in kwargs}
            self.save_pretrained(save_directory, *args, **kwargs)
            if kwargs.get("is_main_process", True):
                hub_options.update({name: kwargs[name] for name in ("token", "max_shard_size") if name in kwargs})
                self.push_to_hub(repo_id, **hub_options)
            return
        saves_here = kwargs.get("is_main_process", True)
        if hasattr(self, "should_save_on_this_rank"):  # tensor parallelism: one rank writes
            saves_here = self.should_save_on_this_rank(saves_here)
        if not saves_here or os.path.isfile(save_directory):
            return super().save_pretrained(save_directory, *args, **kwargs)
        with staged_folder(save_directory, replaces=MODEL_FILES) as staging:  # whole or not at all
            super().save_pretrained(staging, *args, **kwargs)
            write_weights_checksums(staging)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        if source is not None and os.path.isdir(source):
            folder = Path(source) / (kwargs.get("subfolder") or "")
            verify_weights_checksums(folder)
            check_generation_config(folder)
        try:
            return super().from_pretrained(*args, **kwargs)
        except Exception as error:  # safetensors' own error (a header that does not read) names no file
            if type(error).__name__ != "SafetensorError" or source is None or not os.path.isdir(source):
                raise
            names = ", ".join(weights_files(Path(source) / (kwargs.get("subfolder") or ""))) or "its weights"
            raise OSError(f"{source}: {names} cannot be read as safetensors ({error}): the file is damaged or is "
                          "not a weights file. Save or download the folder again.") from error


TOKENIZER_RECORD = "tokenizer_vocabulary"  # the key of the record in a model's config
# a SentencePiece tokenizer's model files (Marian's), beside its vocabulary: what segments the text into pieces
SENTENCEPIECE_MODELS = {"spm_source": "source.spm", "spm_target": "target.spm"}


def _json_sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def tokenizer_vocabulary(tokenizer) -> dict:
    """What identifies `tokenizer`'s vocabulary: `{"tokens": len(tokenizer), "sha256": ...}`, the SHA-256 of its
    token -> id map (`get_vocab()`, added tokens included; a Marian tokenizer's target vocabulary too), and for a
    SentencePiece tokenizer `"pieces_sha256"`: the SHA-256 of the pieces of each model file (`source.spm`, ...)."""
    vocabularies = [tokenizer.get_vocab()]
    if getattr(tokenizer, "separate_vocabs", False):
        vocabularies.append(tokenizer.target_encoder)
    record = {"tokens": len(tokenizer),
              "sha256": _json_sha256([sorted(vocabulary.items(), key=lambda item: (item[1], item[0]))
                                      for vocabulary in vocabularies])}
    pieces = {}
    for attribute, name in SENTENCEPIECE_MODELS.items():
        model = getattr(tokenizer, attribute, None)
        if callable(getattr(model, "get_piece_size", None)):
            pieces[name] = _json_sha256([model.id_to_piece(index) for index in range(model.get_piece_size())])
    if pieces:
        record["pieces_sha256"] = pieces
    return record


def record_tokenizer(config, tokenizer) -> None:
    """Record in a model's `config` the vocabulary of the `tokenizer` it is trained with ([`tokenizer_vocabulary`]):
    every save of the model (checkpoints, the final folder, `push_to_hub`) then carries it in `config.json`."""
    setattr(config, TOKENIZER_RECORD, tokenizer_vocabulary(tokenizer))


def _vocabulary_file(tokenizer) -> Path | str:
    """The file of `tokenizer`'s folder that holds its token -> id map (`tokenizer.json`, a Marian `vocab.json`),
    else the folder (or the name) it was loaded from."""
    folder = Path(tokenizer.name_or_path or ".")
    names = ["tokenizer.json"] if getattr(tokenizer, "backend_tokenizer", None) is not None else \
        [name for name in getattr(tokenizer, "vocab_files_names", {}).values() if name.endswith((".json", ".model"))]
    return next((folder / name for name in names if (folder / name).is_file()), tokenizer.name_or_path or "tokenizer")


def check_tokenizer_record(tokenizer, config, config_file: str | os.PathLike | None = None) -> None:
    """Refuse `tokenizer` for a model whose `config` (a config or its `config.json` mapping) records another
    vocabulary ([`record_tokenizer`]); a config without the record (a save that predates it, an opus-mt or T5
    folder) refuses only a tokenizer with more tokens than the model's `vocab_size`. `config_file` names the config
    in the error (else `config.json` of the model's `name_or_path`).

    Raises:
        ValueError: naming the tokenizer's file (`tokenizer.json`, `vocab.json`, `source.spm`, ...) and the config.
    """
    def value(name):
        return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

    record = value(TOKENIZER_RECORD)
    if config_file is None:
        name = value("name_or_path") or value("_name_or_path")
        config_file = Path(name, "config.json") if name else "the model's config"
    file = _vocabulary_file(tokenizer)
    advice = ("another model's tokenizer was copied into the folder: put back the tokenizer files saved with the "
              "model, or load the model with its own tokenizer.")
    if not isinstance(record, dict):
        vocab_size = value("vocab_size")
        if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
            raise ValueError(f"{file} holds {len(tokenizer)} tokens, more than the {vocab_size} the model embeds "
                             f"(`vocab_size` in {config_file}): it is not the model's tokenizer; {advice}")
        return
    found = tokenizer_vocabulary(tokenizer)
    if found["tokens"] != record.get("tokens") or found["sha256"] != record.get("sha256"):
        raise ValueError(
            f"{file} is not the tokenizer the model was trained with: its vocabulary ({found['tokens']} tokens, "
            f"SHA-256 {found['sha256'][:12]}...) is not the one {config_file} records ({record.get('tokens')} tokens, "
            f"SHA-256 {str(record.get('sha256'))[:12]}...), so it would map text to other ids; {advice}"
        )
    for name, digest in (record.get("pieces_sha256") or {}).items():
        if found.get("pieces_sha256", {}).get(name, digest) != digest:
            raise ValueError(f"{Path(tokenizer.name_or_path or '.') / name} is not the SentencePiece model the model "
                             f"was trained with: its pieces are not those {config_file} records, so it would segment "
                             f"text into other tokens; {advice}")


def check_folder_tokenizer(tokenizer, config_file: str | os.PathLike | None) -> None:
    """[`check_tokenizer_record`] of `tokenizer` against the model `config.json` at `config_file` (None, or a file
    that is not a JSON mapping: nothing is checked, the model's load names a damaged one)."""
    if config_file is None or not Path(config_file).is_file():
        return
    try:
        values = json.loads(Path(config_file).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    if isinstance(values, dict):
        check_tokenizer_record(tokenizer, values, config_file)
