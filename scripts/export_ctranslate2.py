#!/usr/bin/env python
"""Convert a saved `encoder_type="transformer"` MGSA folder (Marian backbone) to a CTranslate2 model.

The other encoder types have no CTranslate2 form (its Transformer spec has plain attention only): export them with
`scripts/export_onnx.py`.

    python scripts/export_ctranslate2.py runs/mgsa-multi30k runs/mgsa-multi30k-ct2 [--quantization int8]

Translate with the model's own tokenizer (CTranslate2 reads token strings):

    import ctranslate2
    from transformers import AutoTokenizer
    from mgsa_hf.export import translate_ctranslate2
    translator = ctranslate2.Translator("runs/mgsa-multi30k-ct2")
    tokenizer = AutoTokenizer.from_pretrained("runs/mgsa-multi30k")
    translate_ctranslate2(translator, tokenizer, ["A dog runs."], beam_size=4)
"""

import argparse
import json

from mgsa_hf.export import export_ctranslate2


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a folder saved by save_pretrained (model and tokenizer)")
    parser.add_argument("output_dir", help="the CTranslate2 model folder to write")
    parser.add_argument("--quantization", default=None,
                        help="CTranslate2 weight type: int8, int8_float32, int16, float16, bfloat16 (default float32)")
    parser.add_argument("--force", action="store_true", help="overwrite output_dir")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    path = export_ctranslate2(args.model, args.output_dir, quantization=args.quantization, force=args.force)
    print(json.dumps({"model": args.model, "output_dir": str(path), "quantization": args.quantization or "float32"}))


if __name__ == "__main__":
    main()
