#!/usr/bin/env python
"""Write an MGSA model folder from a Marian (opus-mt style) or T5 folder or Hub id.

Every Marian (T5) weight is kept; the chosen encoder variant's new modules start so that the model computes what the
source computed, as far as the variant allows (`--new-modules-init identity`, see `mgsa_hf.conversion`), or with the
variant's own initialisation (`random`). The tokenizer
(and the MGSA processor, when a parser is available) are saved beside the model so the folder is ready for fine-tuning:

    python scripts/convert_marian.py path/to/opus-mt-en-de out/opus-mt-en-de-rhe --encoder-type rhe
"""

import argparse
import json

from mgsa_hf.configuration_mgsa import ENCODER_TYPES
from mgsa_hf.conversion import check_folder_or_hub_id, convert_checkpoint


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("marian", help="Marian or T5 model folder (or a Hub id, when online)")
    parser.add_argument("output_dir", help="where to write the MGSA model folder")
    parser.add_argument("--encoder-type", default=None, choices=ENCODER_TYPES,
                        help="the encoder to build (default: the checkpoint's own)")
    parser.add_argument("--new-modules-init", choices=["identity", "random"], default="identity",
                        help="how the variant's new modules start (default: as an identity where the variant allows)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=JSON",
        help="extra MgsaConfig fields, e.g. --set rhe_mode='\"sea_all\"' rhe_layers='[0,1]'",
    )
    args = parser.parse_args(argv)
    args.overrides = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        try:
            args.overrides[field] = json.loads(value) if sep else None
        except json.JSONDecodeError as error:
            parser.error(f"--set {item}: the value after '=' must be JSON ({error}), e.g. rhe_layers='[0,1]' or "
                         "rhe_mode='\"sea_all\"'.")
        if not sep or not field:
            parser.error(f"--set {item}: expected FIELD=JSON.")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:  # a missing folder, not the Hub client's `Repo id must be in the form ...`
        check_folder_or_hub_id(args.marian, "marian")
    except FileNotFoundError as error:
        raise SystemExit(f"convert_marian.py: {error}") from None
    overrides = args.overrides
    report = convert_checkpoint(args.marian, args.output_dir, encoder_type=args.encoder_type,
                                new_modules_init=args.new_modules_init, **overrides)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
