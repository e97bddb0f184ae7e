"""The rows the benchmarks compare: the rows shipped in the package (`src/mgsa_hf/rows/`, see `training_recipes`).

A row is a set of [`MgsaConfig`] fields of one encoder type (the benchmark's recipe gives the sizes). Each encoder
type's default is the row named by the type (`"hybrid"`); every other row is a config file of its variant's folder,
named `<encoder_type>/<file stem>` (`"phrase_representation/max_attn_ta_parse"`), so a new row is a new file.
"""

import json
import os
from pathlib import Path

from .configuration_mgsa import ENCODER_TYPES
from .training_recipes import ROWS


# the source checkout (`src/mgsa_hf/` → the repository), whose `benchmarks/` the benchmarks use
REPOSITORY = Path(__file__).resolve().parents[2]
CONFIGS = ROWS  # rows/<encoder_type>/<row>.json
BASELINE = "transformer"
# the config file of each encoder type's default, where its fields are written out: a run folder of an earlier
# default under the same name (MG-SA's was the n-gram row) is then told apart by its fields
DEFAULT_ROW_FILES = {"phrase_memory": "phrase_memory/syntactic_tag_on_lstm"}
# each paper's best row besides the defaults (the defaults of MG-SA, hybrid and RHE are their papers' best rows)
BEST_ROWS = ("phrase_representation/max_attn_ta_parse",)
# the rows the speed benchmarks time, the reference first: the defaults, MG-SA's n-gram row (Table 3 row 2), PR's best
# row and RHE's other modes
SPEED_ROWS = ("transformer", "phrase_memory/ngram_sans_layer_0", "phrase_memory", "phrase_representation",
              "phrase_representation/max_attn_ta_parse", "hybrid", "rhe", "rhe/dea_rhe", "rhe/rhe_prune")


def config_row(name: str) -> dict:
    """The fields of the row file `rows/<name>.json` (`name` as `<encoder_type>/<file stem>`)."""
    path = CONFIGS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"row {name!r}: no file {path}.")
    return json.loads(path.read_text())


def default_rows() -> dict[str, dict]:
    """Every encoder type's default row, the transformer first."""
    rows = {name: {"encoder_type": name} for name in ENCODER_TYPES}
    rows.update({name: config_row(file) for name, file in DEFAULT_ROW_FILES.items()})
    return rows


def named_row(name: str) -> dict:
    """The row `name`: an encoder type (its default) or `<encoder_type>/<file stem>` (a config file)."""
    return default_rows()[name] if name in ENCODER_TYPES else config_row(name)


def rows_named(names) -> dict[str, dict]:
    """Row name → config fields of each of `names` (see [`named_row`])."""
    return {name: named_row(name) for name in names}


def resolve_rows(specs: list[str]) -> dict[str, dict]:
    """
    Row name → config fields, the baseline first, for a command line's row specs: `defaults` (every encoder type's
    default), `best` (each paper's best row besides them), an encoder type, a row name `<encoder_type>/<file stem>`,
    or the path of a JSON file of config fields (named `<encoder_type>/<file stem>` too).
    """
    rows = {BASELINE: default_rows()[BASELINE]}
    for spec in specs:
        if spec == "defaults":
            rows.update(default_rows())
        elif spec == "best":
            rows.update({name: config_row(name) for name in BEST_ROWS})
        elif spec in ENCODER_TYPES or (CONFIGS / f"{spec}.json").is_file():
            rows[spec] = named_row(spec)
        elif Path(spec).is_file():
            fields = json.loads(Path(spec).read_text())
            if fields.get("encoder_type") not in ENCODER_TYPES:
                raise SystemExit(f"{spec} must set `encoder_type` to one of {sorted(ENCODER_TYPES)}.")
            rows[f"{fields['encoder_type']}/{Path(spec).stem}"] = fields
        else:
            raise SystemExit(f"row {spec!r} is neither `defaults`, `best`, an encoder type, a packaged row nor a "
                             "JSON file.")
    return rows


def package_environment() -> dict[str, str]:
    """This process's environment with this package's folder on `PYTHONPATH`, for the benchmarks' child processes
    (`python -m mgsa_hf.benchmarking_...`): the GPU machine has the repository, not the installed package."""
    package_parent = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}


def job_gpus(device: str | None) -> list[str]:
    """
    The GPUs the benchmarks' child processes are spread over, as each child's `CUDA_VISIBLE_DEVICES` (its `cuda`
    then being that GPU alone): every GPU this process sees (`torch.cuda.device_count()`, named as this process's
    `CUDA_VISIBLE_DEVICES` names them) when the runs train on the GPU (`device` None or `"cuda"`); none for `"cpu"`,
    a GPU named by its index (`"cuda:1"`) or a machine without one.
    """
    import torch

    if device not in (None, "cuda") or not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    visible = [gpu.strip() for gpu in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if gpu.strip()]
    return visible[:count] if visible else [str(index) for index in range(count)]


def least_busy_gpu(gpus: list[str], busy: list[str | None]) -> str | None:
    """The GPU of `gpus` that the fewest running jobs use (`busy`: each running job's GPU), the first on a tie, so
    jobs started together go round-robin; None without GPUs."""
    return min(gpus, key=busy.count) if gpus else None
