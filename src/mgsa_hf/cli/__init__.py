"""The `mgsa-hf` command line: `train` (and `finetune`) a translation model from a named recipe, `prepare` a recipe's
corpus once before training, `translate` with a saved folder, `evaluate` it on a corpus split, `convert` a Marian or
T5 folder into a variant, `export` it to ONNX or CTranslate2, `demo` every encoder type in seconds, and
`accelerate-config` gives the path of a packaged `accelerate launch` config.

User errors (a missing file or folder, an unknown key or recipe, a bad value) end the command with one line on
standard error and a non-zero exit status; `--debug` shows the traceback instead."""

import argparse
import dataclasses
import re
import sys
import tempfile
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError

from ..training.catalogue import (
    ACCELERATE_CONFIGS,
    DATA_ENV,
    FINETUNE_RECIPE,
    SHARED_MULTI30K,
    accelerate_config_names,
    accelerate_config_path,
    recipe_names,
    row_names,
)
from ..training.config import TrainConfig, add_train_arguments
from ..training.prepare_command import add_prepare_arguments
from . import commands as cli_commands


DEMO_PAIRS = [
    ("A man rides a bike down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman in a red dress is singing on stage.", "Eine Frau in einem roten Kleid singt auf der Bühne."),
    ("Children play soccer in a park.", "Kinder spielen Fußball in einem Park."),
]


def demo(args: argparse.Namespace) -> None:
    """Every encoder type through the real path, in seconds: a joint tokenizer trained on a few sentence pairs, the
    processor (spaCy parse and every syntax field), a small random model, save, reload, 4-beam generation."""
    from pathlib import Path

    import torch

    from .. import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor
    from ..tokenization_utils import train_joint_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for lang, column in (("en", 0), ("de", 1)):
            (folder / f"demo.{lang}").write_text("\n".join(pair[column] for pair in DEMO_PAIRS) + "\n")
        tokenizer = train_joint_tokenizer(folder / "demo.en", folder / "demo.de", folder / "tokenizer", vocab_size=120)
        processor = MgsaProcessor(tokenizer)
        inputs = processor([DEMO_PAIRS[0][0], DEMO_PAIRS[1][0]], return_tensors="pt")
        torch.manual_seed(0)
        for encoder_type in args.encoder_types:
            config = MgsaConfig(
                vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id, forced_eos_token_id=tokenizer.eos_token_id,
                encoder_type=encoder_type, num_phrase_tags=len(processor.phrase_tags),
            )
            model = MgsaForConditionalGeneration(config).eval()
            model.save_pretrained(folder / encoder_type)
            reloaded = MgsaForConditionalGeneration.from_pretrained(folder / encoder_type).eval()
            output = reloaded.generate(**inputs, num_beams=4, max_new_tokens=8)
            print(f"{encoder_type:>22}: {model.num_parameters():,} parameters, saved, reloaded, generated "
                  f"{output.shape[0]} sentences of {output.shape[1]} tokens from the parsed sources")


ACCELERATE_CONFIG_DESCRIPTION = """The path of a packaged `accelerate launch` config, so that a launch works from
an installed wheel; with no NAME, the names and what each is for. --write DIR copies the named config (or all of
them, with their README.md: what to set) into DIR to edit.

    accelerate launch --config_file "$(mgsa-hf accelerate-config multi_gpu_ddp)" -m mgsa_hf.cli train recipe=wmt14
    mgsa-hf accelerate-config --write my-configs
"""


def accelerate_config(args: argparse.Namespace) -> None:
    """`mgsa-hf accelerate-config [NAME] [--write DIR]`: print a packaged config's path, list the configs, or copy
    them into a folder (never over an existing file)."""
    import shutil
    from pathlib import Path

    if args.write is None:
        if args.name is None:
            for name, line in accelerate_config_names().items():
                print(f"{name:<16} {line}")
        else:
            print(accelerate_config_path(args.name))
        return
    names = [args.name] if args.name else list(accelerate_config_names())
    sources = [accelerate_config_path(name) for name in names]
    if args.name is None:  # what each is for and what to set
        sources.append(ACCELERATE_CONFIGS / "README.md")
    folder = Path(args.write)
    if existing := [source.name for source in sources if (folder / source.name).exists()]:
        raise FileExistsError(f"{folder} already holds {', '.join(existing)}: not overwritten (remove them or choose "
                              "another DIR).")
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources:
        print(shutil.copyfile(source, folder / source.name))


# what a user gets wrong: one line, no traceback (--debug shows it); torch's and Python's own faults keep theirs.
# StrictDataclassError: a model or processor field's value refused by its configuration's validation
USER_ERRORS = (OSError, ValueError, ImportError, KeyError, StrictDataclassError)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line that points at `--help`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def train_epilog() -> str:
    """The config keys with their defaults, the named recipes and the packaged rows, for `mgsa-hf train --help`."""
    keys = []
    for item in dataclasses.fields(TrainConfig):
        default = item.default_factory() if item.default is dataclasses.MISSING else item.default
        keys.append(f"  {item.name} = {default!r}")
    recipes = [f"  {name:<14} {line}" for name, line in recipe_names().items()]
    rows = row_names()
    width, lines, line = 110, [], " "
    for name in rows:
        if len(line) + len(name) + 1 > width:
            lines.append(line)
            line = " "
        line += f" {name}"
    lines.append(line)
    return "\n".join([
        "config keys (key=value; section.key=value inside model, processor, training), with the defaults of "
        "TrainConfig (a recipe sets many of them):", *keys,
        f"  (data: ${DATA_ENV}/multi30k where {DATA_ENV} is set, else {SHARED_MULTI30K} from the working directory; "
        "threads: torch's CPU threads, 1 on a busy machine)", "",
        "recipes (recipe=NAME, or a YAML/JSON file's path as the first argument; default: `default`):", *recipes, "",
        f"init_from=FOLDER without a recipe fine-tunes with recipe={FINETUNE_RECIPE} (its learning rate and steps); "
        "with a from-scratch recipe named, that recipe's training settings are used and its model section is not.",
        "", "rows of the papers' tables (model=ROW sets their model fields; model.key=value after it changes one):",
        *lines, "", "examples:", "  mgsa-hf train model.encoder_type=rhe training.max_steps=2000 output_dir=runs/rhe",
        "  mgsa-hf train recipe=tiny model=rhe/dea_rhe data=path/to/multi30k",
        "  mgsa-hf train recipe=finetune init_from=runs/mgsa-multi30k model.encoder_type=hybrid",
    ])


def run_train(args) -> dict:
    """`mgsa-hf train ...` (`training.run.run_train`, imported when the command runs)."""
    from ..training.run import run_train

    return run_train(args)


def run_prepare(args) -> None:
    """`mgsa-hf prepare ...` (`training.prepare_command.run_prepare`)."""
    from ..training.prepare_command import run_prepare

    run_prepare(args)


def run_finetune(args) -> dict:
    """`mgsa-hf finetune ...` = `mgsa-hf train recipe=finetune ...`."""
    if args.config is not None and "=" not in args.config:
        raise ValueError(f"mgsa-hf finetune takes key=value overrides only, not {args.config!r}: the recipe is "
                         f"{FINETUNE_RECIPE} (use `mgsa-hf train CONFIG` for another).")
    args.overrides = [f"recipe={FINETUNE_RECIPE}", *([args.config] if args.config else []), *args.overrides]
    args.config = None
    return run_train(args)


def build_parser() -> argparse.ArgumentParser:
    """`mgsa-hf` and its commands."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(prog="mgsa-hf", description=__doc__, formatter_class=raw)
    parser.add_argument("--debug", action="store_true", dest="debug_first", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    def command(name, function, help, description=None, epilog=None):
        subparser = commands.add_parser(name, help=help, description=description or help, epilog=epilog,
                                        formatter_class=raw)
        subparser.set_defaults(func=function)
        return subparser

    train = command("train", run_train, "train a translation model (Seq2SeqTrainer) from a recipe and overrides",
                    epilog=train_epilog())
    add_train_arguments(train)
    finetune = command("finetune", run_finetune, f"fine-tune init_from=FOLDER (or upgrade it with "
                       f"model.encoder_type=...): train with recipe={FINETUNE_RECIPE}", epilog=train_epilog())
    add_train_arguments(finetune)
    prepare = command("prepare", run_prepare, "tokenize and parse a recipe's corpus once, on disk, before training")
    add_prepare_arguments(prepare)
    translate = command("translate", cli_commands.run_translate, "translate lines with a saved (or ONNX) folder",
                        cli_commands.TRANSLATE_DESCRIPTION)
    cli_commands.add_translate_arguments(translate)
    evaluate = command("evaluate", cli_commands.run_evaluate, "score a saved folder on a corpus split (BLEU, chrF)",
                       cli_commands.EVALUATE_DESCRIPTION)
    cli_commands.add_evaluate_arguments(evaluate)
    from .convert_arguments import CONVERT_DESCRIPTION

    convert = command("convert", cli_commands.run_convert, "upgrade a Marian or T5 folder with an encoder variant",
                      CONVERT_DESCRIPTION)
    cli_commands.add_convert_arguments(convert)
    export = command("export", cli_commands.run_export, "export a saved folder: onnx (any encoder type) or ct2")
    cli_commands.add_export_arguments(export)
    demo_parser = command("demo", demo, "build, save, reload and run a small model of each encoder type")
    demo_parser.add_argument(
        "--encoder-types", nargs="*", help="(default: all)",
        default=["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"],
    )
    launcher = command("accelerate-config", accelerate_config, "the path of a packaged `accelerate launch` config, "
                       "or the list of them", ACCELERATE_CONFIG_DESCRIPTION)
    launcher.add_argument("name", nargs="?", metavar="NAME", help="a config's name (default: list them): "
                          + ", ".join(accelerate_config_names()))
    launcher.add_argument("--write", metavar="DIR", help="copy the config (default: all of them) into DIR")
    for name, subparser in commands.choices.items():
        if name != "export":  # its formats take it
            subparser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


# Transformers' `pipeline(...)` turns the error of each model class it tried into "Could not load model X with any
# of the following classes: (...). See the original errors: ... <their tracebacks>": a page of tracebacks
_PIPELINE_LOAD = re.compile(r"^Could not load model (?P<model>.+?) with any of the following classes:.*?"
                            r"See the original errors:", re.DOTALL)
_LAST_EXCEPTION = re.compile(r"^[\w.]+(Error|Exception): (?P<message>.*?)\s*(\n\n|\Z)", re.DOTALL | re.MULTILINE)


def one_line(error: BaseException) -> str:
    """An exception's message on one line (a `KeyError`'s without its quotes); a model that `pipeline(...)` could
    not load gives the error that stopped its load, not the tracebacks around it."""
    message = str(error.args[0] if isinstance(error, KeyError) and error.args else error)
    if (wrapped := _PIPELINE_LOAD.match(message)) and (causes := list(_LAST_EXCEPTION.finditer(message))):
        message = f"could not load the model {wrapped['model']}: {causes[-1]['message']}"
    return " ".join(message.split()) or type(error).__name__


def refuse_output_over_what_is_read(args) -> None:
    """An `--output` file that is the command's `--input` (by any name: a symbolic link, `..`) or lies in the model
    folder it reads would replace what is read (`translate --output` over its input replaced the sources with their
    translations): refused with a `ValueError` naming both."""
    output = getattr(args, "output", None)
    if not output:
        return
    written = Path(output).expanduser().resolve()
    source = getattr(args, "input", None)
    if source and Path(source).expanduser().resolve() == written:
        raise ValueError(f"--output {output} is the file read, --input {source}: writing it would replace the "
                         "sentences read. Name another output file.")
    for folder in (getattr(args, "model", None), getattr(args, "folder", None)):
        read = Path(folder).expanduser() if folder else None
        if read is not None and read.is_dir() and written.is_relative_to(read.resolve()):
            raise ValueError(f"--output {output} lies in the model folder read, {folder}: writing it would change "
                             "the model. Name a file outside it.")


def main(argv=None) -> None:
    """`mgsa-hf COMMAND ...`: a user error exits with status 1 and one line on standard error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    debug = args.debug or args.debug_first
    try:
        refuse_output_over_what_is_read(args)
        args.func(args)
    except USER_ERRORS as error:
        if debug:
            raise
        raise SystemExit(f"mgsa-hf {args.command}: error: {one_line(error)}") from None

