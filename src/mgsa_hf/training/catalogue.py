"""The named training recipes, paper rows and `accelerate launch` configs shipped inside the package, so that
`mgsa-hf train recipe=finetune`, `mgsa-hf train model=rhe/dea_rhe` and
`accelerate launch --config_file "$(mgsa-hf accelerate-config multi_gpu_ddp)" -m mgsa_hf.cli train` work from an
installed wheel.

A recipe is a YAML file of [`~mgsa_hf.training.TrainConfig`] keys in `recipes/` here (`default` is what `mgsa-hf train`
runs without one); a row is a JSON file of `MgsaConfig` fields of one encoder type in `rows/<encoder_type>/`, named
`<encoder_type>/<file stem>` (the papers' table rows; `rows/<encoder_type>/README.md` maps each to its table). A path
to a file works wherever a name does. A launcher config is a YAML file of `accelerate launch` in
`training/accelerate_configs/` (its `README.md` says what each is for and what to set).

The Multi30k recipes read their corpus from [`default_data`]: `$MGSA_HF_DATA/multi30k` where that variable names the
folder holding the project's data, else `../shared/data/multi30k` from the working directory.
"""

import json
import os
from pathlib import Path


TRAINING = Path(__file__).resolve().parent
PACKAGE = TRAINING.parent
RECIPES = TRAINING / "recipes"
ROWS = PACKAGE / "rows"
ACCELERATE_CONFIGS = TRAINING / "accelerate_configs"
DEFAULT_RECIPE = "default"
FINETUNE_RECIPE = "finetune"
# the folder holding the project's data (`multi30k/`, `ptb-wsj-sample/`), and where Multi30k is without it
DATA_ENV = "MGSA_HF_DATA"
SHARED_MULTI30K = "../shared/data/multi30k"
# where the docs say how to get Multi30k
DATA_DOCS = 'docs/getting-started.md#the-data ("Getting started", "The data")'
TRAIN_DATA_OPTION = ("data=FOLDER (a folder of {split}.{lang}[.gz] or {split}.jsonl files, a .jsonl file or a Hub "
                     "dataset id)")


def default_data(checkout: Path | None = None) -> str:
    """The Multi30k folder read when no `data=` (`--data`) is given: the recipes', `mgsa-hf evaluate`'s and the
    benchmark scripts'. `$MGSA_HF_DATA/multi30k` (absolute) where `MGSA_HF_DATA` is set, else `../shared/data/multi30k`
    from the working directory (from `checkout`, the benchmark scripts' repository, when given)."""
    root = os.environ.get(DATA_ENV)
    if root:
        return str(Path(root).expanduser().resolve() / "multi30k")
    return str(checkout.parent / "shared" / "data" / "multi30k") if checkout else SHARED_MULTI30K


def missing_data_message(source: str | Path, option: str = TRAIN_DATA_OPTION) -> str:
    """What to do when the corpus `source` (a local path) does not exist: the path tried, `option` and
    `MGSA_HF_DATA`, and the docs on getting Multi30k."""
    where = f"{DATA_ENV}={os.environ[DATA_ENV]!r} is set" if os.environ.get(DATA_ENV) else f"{DATA_ENV} is not set"
    return (f"corpus {str(source)!r} does not exist (tried {os.path.abspath(source)}; {where}). Pass {option}, or "
            f"set {DATA_ENV} to the folder that holds multi30k/. Getting Multi30k: {DATA_DOCS}.")


def looks_local(source: str | Path) -> bool:
    """Whether a corpus `source` is written as a local path (`./`, `../`, `/`) rather than a Hub dataset id."""
    return str(source).startswith((".", "/"))


def _first_comment_lines(folder: Path) -> dict[str, str]:
    """File stem → the first line of its leading comment, for every YAML file of `folder`, sorted by name."""
    names = {}
    for path in sorted(folder.glob("*.yaml")):
        first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
        names[path.stem] = first
    return names


def recipe_names() -> dict[str, str]:
    """Recipe name → the first line of its leading comment (what it is for), sorted by name."""
    return _first_comment_lines(RECIPES)


def accelerate_config_names() -> dict[str, str]:
    """Launcher config name (`multi_gpu_ddp`) → the first line of its leading comment (what it is for), sorted."""
    return _first_comment_lines(ACCELERATE_CONFIGS)


def accelerate_config_path(name: str) -> Path:
    """The packaged `accelerate launch --config_file` file of a launcher config name (`multi_gpu_ddp`).

    Raises:
        FileNotFoundError: when no packaged config has that name (the message lists the names).
    """
    path = ACCELERATE_CONFIGS / f"{name}.yaml"
    if Path(name).name != name or not path.is_file():
        raise FileNotFoundError(f"no packaged accelerate config {name!r} (the configs: "
                                f"{', '.join(accelerate_config_names())}).")
    return path


def row_names() -> list[str]:
    """Every packaged row, `<encoder_type>/<file stem>`, sorted."""
    return sorted(f"{path.parent.name}/{path.stem}" for path in ROWS.glob("*/*.json"))


def recipe_path(name_or_path: str | Path) -> Path:
    """The YAML/JSON file of a recipe: an existing file's path, or the name of a packaged recipe (`finetune`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = RECIPES / f"{name_or_path}.yaml"
    if "/" not in str(name_or_path) and packaged.is_file():
        return packaged
    raise FileNotFoundError(f"training config {str(name_or_path)!r} is neither a file nor a packaged recipe "
                            f"({', '.join(recipe_names())}).")


def row_fields(name_or_path: str) -> dict:
    """The model fields of a row: `<encoder_type>/<file stem>` (a packaged row), an encoder type alone (its default,
    `{"encoder_type": name}`), or the path of a JSON file of fields."""
    from ..configuration_mgsa import ENCODER_TYPES
    from ..saved_files import check_json_file

    if name_or_path in ENCODER_TYPES:
        return {"encoder_type": name_or_path}
    packaged = ROWS / f"{name_or_path}.json"
    path = packaged if packaged.is_file() else Path(name_or_path)
    if not path.is_file() or path.suffix != ".json":
        raise FileNotFoundError(f"model={name_or_path!r} is neither an encoder type, a packaged row (such as "
                                "rhe/dea_rhe; `mgsa-hf train --help` lists them) nor a JSON file of model fields.")
    check_json_file(path)  # names the file and line of bad JSON
    fields = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(fields, dict):
        raise ValueError(f"model={name_or_path!r}: {path} must hold a JSON object of model fields.")
    return fields


def override_key(override: str) -> str:
    """The key of a `key=value` override."""
    return override.partition("=")[0].strip()


def expand_rows(overrides: list[str]) -> list[str]:
    """`model=<encoder_type>/<row>` (a packaged row, or a JSON file) → one `model.<field>=<json>` override per field,
    in its place, so that later `model.*` overrides change it."""
    expanded = []
    for override in overrides:
        value = override.partition("=")[2].strip()
        if override_key(override) == "model" and not value.startswith("{"):
            expanded.extend(f"model.{key}={json.dumps(field)}" for key, field in row_fields(value).items())
        else:
            expanded.append(override)
    return expanded
