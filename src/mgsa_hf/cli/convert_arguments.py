"""The command line of `mgsa-hf convert` ([`~mgsa_hf.training.conversion.convert_checkpoint`]) and the `--overwrite`
option of every command that writes a folder: argument definitions only, so that building the parser imports no
model code."""

import json

from ..encoder_types import ENCODER_TYPES


CONVERT_DESCRIPTION = """Write an MGSA model folder from a Marian (opus-mt style) or T5 folder or Hub id.

Every Marian (T5) weight is kept; the chosen encoder variant's new modules start so that the model computes what the
source computed, as far as the variant allows (`--new-modules-init identity`, see this module), or with the
variant's own initialisation (`random`). The tokenizer (and the MGSA processor, when a parser is available) are saved
beside the model so the folder is ready for fine-tuning:

    mgsa-hf convert path/to/opus-mt-en-de out/opus-mt-en-de-rhe --encoder-type rhe

An output folder that holds files is refused unless --overwrite, which replaces the model folder there whole (its
other files are kept); the source folder itself is never written.
"""


def add_convert_arguments(parser) -> None:
    """The arguments of `mgsa-hf convert`."""
    parser.add_argument("marian", help="Marian or T5 model folder (or a Hub id, when online)")
    parser.add_argument("output_dir", help="where to write the MGSA model folder")
    parser.add_argument("--encoder-type", default=None, choices=ENCODER_TYPES,
                        help="the encoder to build (default: the checkpoint's own)")
    parser.add_argument("--new-modules-init", choices=["identity", "random"], default="identity",
                        help="how the variant's new modules start (default: as an identity where the variant allows)")
    add_overwrite_argument(parser, "replace the model folder that output_dir holds (model, processor, card and code "
                                   "files; its other files are kept)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="keep the source processor's settings that name code to run (a tree_parser import path, "
                             "parser_code)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=JSON",
        help="extra MgsaConfig fields, e.g. --set rhe_mode='\"sea_all\"' rhe_layers='[0,1]'",
    )


def add_overwrite_argument(parser, replaces: str) -> None:
    """`--overwrite`, the one option of every command that writes a folder: without it, a folder that holds files is
    refused ([`~ownership.check_output_folder`])."""
    parser.add_argument("--overwrite", action="store_true",
                        help=f"{replaces} (default: a non-empty output_dir is refused; the folder read never is "
                             "written)")


def parse_set_fields(items: list[str]) -> dict:
    """`--set FIELD=JSON ...` → {field: value}; a `ValueError` names an item that is not FIELD=JSON."""
    fields = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise ValueError(f"--set {item}: expected FIELD=JSON.")
        try:
            fields[field] = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"--set {item}: the value after '=' must be JSON ({error}), e.g. rhe_layers='[0,1]' or "
                             "rhe_mode='\"sea_all\"'.") from None
    return fields
