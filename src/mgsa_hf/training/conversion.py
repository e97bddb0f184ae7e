"""Upgrade a Marian (opus-mt style) or T5 checkpoint to an MGSA model folder."""

import inspect
import json
from pathlib import Path

from transformers import PretrainedConfig

from ..configuration_mgsa import MgsaConfig, MgsaT5Config
from ..modeling_mgsa import MgsaForConditionalGeneration
from ..modeling_mgsa_t5 import MgsaT5ForConditionalGeneration
from ..modeling_upgrade import new_module_names


# backbone -> (configuration, model) classes; a checkpoint's model_type (its own or ours) picks the backbone
BACKBONES = {
    "marian": (MgsaConfig, MgsaForConditionalGeneration),
    "t5": (MgsaT5Config, MgsaT5ForConditionalGeneration),
}


def check_folder_or_hub_id(name: str, key: str) -> None:
    """
    Refuse a local path that does not exist before it reaches the Hub client, whose error (`Repo id must be in the
    form ...`) names neither the setting nor the folder. `name` stands for a local folder when it exists, when it
    cannot be a Hub id (`huggingface_hub`'s own check: it starts with `.`, `/` or `~`, has more than one `/`, ...),
    or when it is `first/rest` and `first` is a folder here; otherwise it is a Hub id (`name` or `org/name`) and
    passes.

    Args:
        name (`str`): the folder or Hub id given.
        key (`str`): the setting or argument that gave it, named in the error.

    Raises:
        `FileNotFoundError` naming `key` and `name` when `name` is a local folder that does not exist.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = Path(name).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise FileNotFoundError(f"{key}={name!r} is a file, not a model folder.")
    try:
        validate_repo_id(name)
    except HFValidationError:
        reason = "it cannot be a Hub id"
    else:
        first = name.split("/", 1)[0]
        if "/" not in name or not Path(first).is_dir():
            return  # a Hub id
        reason = f"its first part {first}/ is a folder here"
    raise FileNotFoundError(f"{key}={name!r}: no such folder (read as a local path: {reason}); give an existing "
                            "folder or a Hub id (`name` or `org/name`).")


def checkpoint_backbone(path: str) -> str:
    """"marian" or "t5" for a Marian/MGSA or a T5/MGSA-T5 checkpoint (folder or Hub id)."""
    model_type = PretrainedConfig.get_config_dict(path)[0].get("model_type")
    for backbone, (config_class, _) in BACKBONES.items():
        if model_type in (config_class.model_type, config_class.source_model_type):
            return backbone
    raise ValueError(
        f"{path} holds a {model_type!r} model; MGSA models start from Marian (opus-mt) or T5 checkpoints."
    )


def load_as_mgsa(path: str, encoder_type: str | None = None, new_modules_init: str = "identity", **config_overrides):
    """
    Load a Marian or T5 (or MGSA) checkpoint, folder or Hub id, as [`MgsaForConditionalGeneration`] or
    [`MgsaT5ForConditionalGeneration`], with the checkpoint's own configuration and the given fields changed.

    Args:
        encoder_type: the encoder to build; None keeps the checkpoint's (`"transformer"` for Marian and T5).
        new_modules_init: how the modules the checkpoint lacks (the variant's) start: `"identity"`, so that the model
            computes what the checkpoint computed as far as the variant allows
            ([`~modeling_upgrade.init_new_modules_as_identity`]: a model that already translates keeps translating),
            or `"random"`, the variant's own initialisation, as for training from scratch.
        config_overrides: other configuration fields to change; a name that is no field is an error, and the
            changed configuration is validated as a whole before any weight is read.

    Returns:
        `(model, new_modules)`: the model, and the names of the modules the checkpoint did not have (the variant's).
        Raises `ValueError` if the checkpoint has weights the model cannot take.
    """
    backbone = checkpoint_backbone(path)
    config_class, model_class = BACKBONES[backbone]
    config_class.reject_unknown_fields(config_overrides)  # every name, not only the variant-like ones
    if encoder_type is not None:
        config_overrides["encoder_type"] = encoder_type
    config = config_class.from_pretrained(path, **config_overrides)
    model, info = model_class.from_pretrained(path, config=config, output_loading_info=True,
                                              new_modules_init=new_modules_init)
    if info["unexpected_keys"] or info["mismatched_keys"]:
        unexpected, mismatched = sorted(info["unexpected_keys"]), sorted(info["mismatched_keys"])
        raise ValueError(
            f"{path} is not a {backbone} checkpoint this model can take ({backbone}: the `model_type` of its "
            f"config.json): {len(unexpected)} weights it does not have ({unexpected[:3]}, ...), {len(mismatched)} of "
            f"another shape ({mismatched[:3]}). A config.json that names another architecture than the weights does "
            "this: put back the one saved with them."
        )
    return model, new_module_names(info["missing_keys"])


def saved_processor_settings(folder: str | None, given: dict | None = None, trust_remote_code: bool = False,
                             option: str = "trust_remote_code=True") -> dict:
    """The settings of the processor saved in `folder` (`processor_config.json`), for fine-tuning it; {} without one.
    `with_syntax` is left out: whether to parse follows the model being trained.

    Raises:
        [`~mgsa_hf.syntax_spacy.UntrustedCodeError`] when a setting names code (a `tree_parser` import path,
        `parser_code`) that `given` (the caller's own settings) does not replace, unless `trust_remote_code`.
    """
    from ..processing_mgsa import MgsaProcessor
    from ..saved_files import DamagedFileError, check_json_file
    from ..syntax_spacy import refuse_saved_code

    path = Path(folder) / "processor_config.json" if folder else None
    if path is None or not path.is_file():
        return {}
    check_json_file(path)  # a damaged file is named, with its line
    saved = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(saved, dict):
        raise DamagedFileError(f"{path} is damaged: not a JSON object of processor settings.")
    allowed = set(inspect.signature(MgsaProcessor.__init__).parameters) - {"self", "tokenizer", "with_syntax"}
    saved = {key: value for key, value in saved.items() if key in allowed}
    refuse_saved_code(saved, folder, given, trust_remote_code, option)
    return saved


def convert_checkpoint(path: str, output_dir: str, encoder_type: str | None = None, new_modules_init: str = "identity",
                       trust_remote_code: bool = False, overwrite: bool = False, **overrides):
    """Write `output_dir` with the MGSA model and, when the source has a tokenizer, an [`MgsaProcessor`] around it
    (the source processor's settings, or the defaults; it parses only for encoder types that read syntax); return a
    report. Source processor settings that name code are refused unless `trust_remote_code`
    ([`saved_processor_settings`]).

    `output_dir` must be empty or new, unless `overwrite`: then the model folder it holds (model, processor, card and
    code files) is replaced whole and its other files are kept. It is never the source folder
    ([`~ownership.check_output_folder`])."""
    from transformers import AutoTokenizer

    from ..atomic_saves import staged_folder
    from ..processing_mgsa import MgsaProcessor
    from ..weights_checksums import check_tokenizer_record, record_tokenizer
    from .ownership import check_output_folder, model_folder_patterns

    check_output_folder(output_dir, source=path, overwrite=overwrite)
    saved = saved_processor_settings(path, trust_remote_code=trust_remote_code,
                                     option="trust_remote_code=True`, or `--trust-remote-code")
    model, new_modules = load_as_mgsa(path, encoder_type, new_modules_init, **overrides)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):  # the source has no tokenizer files
        tokenizer = None
    if tokenizer is not None:  # the model's config.json records its vocabulary, checked where the folder is loaded
        check_tokenizer_record(tokenizer, model.config, Path(path, "config.json"))
        record_tokenizer(model.config, tokenizer)
    # model and processor swapped in together, in place of an earlier model folder's files (its processor included)
    with staged_folder(output_dir, replaces=model_folder_patterns()) as staging:
        model.save_pretrained(staging)  # with the model's code, the translation pipeline's included
        if tokenizer is not None:
            # the source processor's settings, if it has one; the parse only where the encoder reads syntax
            settings = {**saved, "with_syntax": model.config.reads_source_syntax}
            MgsaProcessor(tokenizer, **settings).save_pretrained(staging)
    return {
        "source": str(path),
        "output_dir": str(output_dir),
        "encoder_type": model.config.encoder_type,
        "new_modules_init": new_modules_init,
        "parameters": model.num_parameters(),
        "new_modules": new_modules,
        "processor_saved": tokenizer is not None,
    }
