"""The rows the benchmarks compare: the rows shipped in the package (`src/mgsa_hf/rows/`, read by
`mgsa_hf.training.catalogue`).

A row is a set of [`MgsaConfig`] fields of one encoder type (the benchmark's recipe gives the sizes). Each encoder
type's default is the row named by the type (`"hybrid"`); every other row is a config file of its variant's folder,
named `<encoder_type>/<file stem>` (`"phrase_representation/max_attn_ta_parse"`), so a new row is a new file.

Also what every benchmark records beside its results: the repository's folder and the command line, without machine
paths (`recorded_command`).
"""

import functools
import json
import os
import shlex
from pathlib import Path

from ..configuration_mgsa import ENCODER_TYPES
from ..training.catalogue import ROWS


# the source checkout (`src/mgsa_hf/benchmarking/` → the repository), whose `benchmarks/` the benchmarks use
REPOSITORY = Path(__file__).resolve().parents[3]
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


def portable_path(text: str) -> str:
    """`text` as the results in benchmarks/ record it: an absolute path relative to the repository (a corpus beside
    it as `../shared/...`), any other absolute path as its name alone (a scratch file such as saved batches), so that
    no machine's paths go into the results; `KEY=PATH` (`--model transformer=FOLDER`) keeps its key; anything else
    as it is."""
    key, sep, value = text.rpartition("=") if "=" in text and not text.startswith("/") else ("", "", text)
    if not os.path.isabs(value):
        return text
    path = Path(value).resolve()
    for base in (REPOSITORY, REPOSITORY.parent):
        if path.is_relative_to(base):
            return f"{key}{sep}{os.path.relpath(path, REPOSITORY)}"
    return f"{key}{sep}{path.name}"


def recorded_command(script: str, argv) -> str:
    """The command line a benchmark records beside its results: `python <script> <argv>` (`script` relative to the
    repository), each argument shell-quoted and its paths made portable ([`portable_path`])."""
    return shlex.join(["python", script, *(portable_path(str(arg)) for arg in argv)])


def cpu_description() -> str:
    """The CPU a benchmark ran on: its model name (`/proc/cpuinfo`, where there is one), the instruction set torch's
    kernels use and the cores, e.g. "AMD EPYC, AVX2, 2 cores". `platform.platform()` names only the OS, and machines
    with the same OS differ several-fold in fp32 peak rate."""
    import torch

    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"


def package_environment() -> dict[str, str]:
    """This process's environment with this package's folder on `PYTHONPATH`, for the benchmarks' child processes
    (`python -m mgsa_hf.benchmarking.<module>`): the GPU machine has the repository, not the installed package."""
    package_parent = str(Path(__file__).resolve().parents[2])
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


# the papers' model sizes (Vaswani et al., 2017, Table 3), Marian backbone; the vocabulary is left small, as the
# parameters a row adds do not depend on it
TRANSFORMER_SIZES = {
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
    "big": dict(d_model=1024, encoder_layers=6, decoder_layers=6, encoder_attention_heads=16,
                decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096),
}


def parameter_count(fields: dict, size: str = "base") -> int:
    """The parameters of a Marian-backbone model with the row's config `fields` at a Transformer size (`"base"` or
    `"big"`; a row's own sizes win), built on the meta device (nothing is allocated) with a 64-token vocabulary."""
    import torch

    from ..configuration_mgsa import MgsaConfig
    from ..modeling_mgsa import MgsaForConditionalGeneration

    config = MgsaConfig(**{"vocab_size": 64, "pad_token_id": 63, "decoder_start_token_id": 63,
                           **TRANSFORMER_SIZES[size], **fields})
    with torch.device("meta"):
        model = MgsaForConditionalGeneration(config)
    return sum(parameter.numel() for parameter in model.parameters())


@functools.cache
def _baseline_count(size: str, sizes: tuple) -> int:
    return parameter_count({"encoder_type": BASELINE, **dict(sizes)}, size)


def parameters_added(fields: dict, size: str = "base") -> int:
    """The parameters the row `fields` adds to the plain Transformer of the same size (see [`parameter_count`])."""
    sizes = tuple(sorted((key, value) for key, value in fields.items() if key in TRANSFORMER_SIZES[size]))
    return parameter_count(fields, size) - _baseline_count(size, sizes)
