"""Whether a checkpoint belongs to the run that resumes from it.

The Trainer resumes from any checkpoint folder: the weights of another encoder type or backbone load with a warning
about missing keys (and then the optimizer state fails with "loaded state dict contains a parameter group that doesn't
match the size of optimizer's group"), and a checkpoint trained on another vocabulary or other data resumes without a
word. [`MgsaSeq2SeqTrainer`] writes [`RUN_INPUTS`] into each checkpoint (the vocabulary's and the training data's
digests) and, before resuming, compares it and the checkpoint's `config.json` (which a recipe's model records its
tokenizer in, `tokenizer_vocabulary`) with the run's ([`other_run_differences`]).
"""

import hashlib
import json
import logging
from pathlib import Path

from ..weights_checksums import TOKENIZER_RECORD, tokenizer_vocabulary


logger = logging.getLogger(__name__)

# the record of a run's inputs in each of its checkpoints
RUN_INPUTS = "run_inputs.json"
# configuration fields that say how the model is called or saved, not what its weights compute
RUNTIME_FIELDS = frozenset({
    "transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype", "use_cache", "return_dict",
    "output_attentions", "output_hidden_states", "id2label", "label2id", "auto_map", "_attn_implementation_autoset",
})
# rows of the training data hashed, spread over it
SAMPLED_ROWS = 16


def vocabulary_record(processing_class) -> dict | None:
    """[`tokenizer_vocabulary`] of a tokenizer, or of a processor's tokenizer; None without one."""
    if processing_class is not None and not hasattr(processing_class, "get_vocab"):
        processing_class = getattr(processing_class, "tokenizer", None)
    return tokenizer_vocabulary(processing_class) if hasattr(processing_class, "get_vocab") else None


def data_digest(dataset) -> dict | None:
    """The number of rows of a dataset and a hash of `SAMPLED_ROWS` rows spread over it (a `datasets.Dataset`, a list
    or a map-style torch dataset). None for a stream (no length) or rows it cannot give by position."""
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        return None
    rows = len(dataset)
    spread = (rows - 1) / (SAMPLED_ROWS - 1)
    picks = sorted({round(i * spread) for i in range(SAMPLED_ROWS)}) if rows else []
    try:
        if hasattr(dataset, "select") and hasattr(dataset, "to_dict"):  # `datasets.Dataset`: one read of the rows
            sample = dataset.select(picks).to_dict() if picks else {}
        else:
            sample = [dataset[i] for i in picks]
    except (KeyError, IndexError, TypeError):
        return None
    text = json.dumps(sample, sort_keys=True, default=str)
    return {"rows": rows, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def run_inputs(processing_class, train_dataset) -> dict:
    """What [`RUN_INPUTS`] records of a run: its vocabulary's and its training data's digests."""
    return {"vocabulary": vocabulary_record(processing_class), "training_data": data_digest(train_dataset)}


def config_differences(checkpoint: str | Path, config) -> list[str]:
    """The fields of `config` (a model's configuration) that differ from the checkpoint's `config.json`, as
    `"d_model 32 -> 48"`; the backbone alone (`model_type`) where that differs. `[]` without a readable
    `config.json`. A saved configuration holds only the fields off their defaults: the others are the defaults."""
    try:
        saved = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(saved, dict):
        return []
    if saved.get("model_type", config.model_type) != config.model_type:
        return [f"model_type (the backbone) {saved['model_type']} -> {config.model_type}"]
    current = json.loads(config.to_json_string(use_diff=False))
    try:
        defaults = json.loads(type(config)().to_json_string(use_diff=False))
    except (TypeError, ValueError):  # a configuration class that needs arguments: the saved fields alone
        defaults = {}
    saved = {**defaults, **saved}
    differences = [f"{key} {_shown(saved[key])} -> {_shown(value)}" for key, value in sorted(current.items())
                   if key not in RUNTIME_FIELDS | {TOKENIZER_RECORD} and key in saved and saved[key] != value]
    return differences + _vocabulary_change(saved.get(TOKENIZER_RECORD), current.get(TOKENIZER_RECORD))


def other_run_differences(checkpoint: str | Path, config, inputs: dict) -> list[str]:
    """What tells the checkpoint apart from the run that is to resume from it: the model's configuration
    ([`config_differences`]) and, where the checkpoint has its [`RUN_INPUTS`] record, the vocabulary and the training
    data (`inputs`, [`run_inputs`] of the run). `[]`: the checkpoint may be the run's own."""
    differences = config_differences(checkpoint, config)
    record_path = Path(checkpoint) / RUN_INPUTS
    if not record_path.is_file():  # a checkpoint saved before checkpoints held the record
        return differences
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        logger.warning("%s cannot be read (%s): the run's vocabulary and training data are not compared with the "
                       "checkpoint's.", record_path, error)
        return differences
    differences += [change for change in _vocabulary_change(record.get("vocabulary"), inputs.get("vocabulary"))
                    if change not in differences]
    data, saved_data = inputs.get("training_data"), record.get("training_data")
    if isinstance(data, dict) and isinstance(saved_data, dict) and data != saved_data:
        rows = (f"{saved_data.get('rows')} -> {data['rows']} rows" if saved_data.get("rows") != data["rows"]
                else f"other rows, {data['rows']} of them")
        differences.append(f"the training data ({rows})")
    return differences


def _vocabulary_change(saved, current) -> list[str]:
    """`["the vocabulary (...)"]` when two [`tokenizer_vocabulary`] records differ, else `[]`."""
    if not (isinstance(saved, dict) and isinstance(current, dict)) or saved == current:
        return []
    if saved.get("tokens") != current.get("tokens"):
        return [f"the vocabulary ({saved.get('tokens')} -> {current.get('tokens')} tokens)"]
    return [f"the vocabulary (another tokenizer of {current.get('tokens')} tokens)"]


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)
