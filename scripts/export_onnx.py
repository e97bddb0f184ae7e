#!/usr/bin/env python
"""Export a saved MGSA model folder (any encoder type, Marian or T5 backbone) to ONNX.

The graph is the teacher-forced forward: `input_ids`, `attention_mask`, `decoder_input_ids` and the source syntax
fields the encoder type reads, named as the processor makes them, in; `logits` out; batch and lengths dynamic. The
script then runs the graph with onnxruntime on the example batch and on one of another size and prints the largest
difference from the PyTorch logits:

    python scripts/export_onnx.py runs/mgsa-multi30k runs/mgsa-multi30k.onnx

With `--generation`, OUTPUT is a folder for ONNX Runtime generation instead: the encoder graph and the decoder graphs
with past key/values (`export_generation_onnx`; `--int8` quantizes them), with the config,
generation config and processor files, which `OrtMgsaForConditionalGeneration.from_pretrained(OUTPUT)` loads:

    python scripts/export_onnx.py runs/mgsa-multi30k runs/mgsa-multi30k-onnx --generation [--int8]
"""

import argparse
import json

import torch
from transformers import AutoModelForSeq2SeqLM

import mgsa_hf  # noqa: F401  (registers the model types)
from mgsa_hf.export import export_onnx, onnx_input_names, onnx_inputs
from mgsa_hf.processing_mgsa import MgsaProcessor


# (source, target) pairs to trace with and to check against; the check also runs the first one alone in a batch of
# another size
EXAMPLES = [
    ("A man in a blue shirt is standing on a ladder cleaning windows.",
     "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt Fenster."),
    ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A little girl climbs into a wooden playhouse.", "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."),
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a folder saved by save_pretrained (model and processor)")
    parser.add_argument("output", help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    parser.add_argument("--generation", action="store_true",
                        help="write a folder of encoder and decoder-with-past graphs for ONNX Runtime generation")
    parser.add_argument("--int8", action="store_true", help="with --generation: int8 dynamic quantization")
    return parser.parse_args(argv)


def check(model, processor, output: str) -> dict:
    """The largest absolute difference between onnxruntime's and PyTorch's logits on the examples, and on the
    first two examples, a batch of another size."""
    import onnxruntime

    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    names = [graph_input.name for graph_input in session.get_inputs()]
    differences = {}
    for name, pairs in (("example batch", EXAMPLES), ("smaller batch", EXAMPLES[:2])):
        sources, targets = zip(*pairs, strict=True)
        batch = dict(processor(list(sources), text_target=list(targets), return_tensors="pt"))
        batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch.pop("labels"))
        with torch.no_grad():
            expected = model(**batch).logits
        actual = torch.from_numpy(session.run(None, onnx_inputs(batch, names))[0])
        differences[name] = float((actual - expected).abs().max())
    return differences


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.generation:
        from mgsa_hf.export.onnx_generation import MANIFEST, export_generation_onnx

        folder = export_generation_onnx(args.model, args.output, quantize=args.int8, opset=args.opset)
        print((folder / MANIFEST).read_text())
        return
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    processor = MgsaProcessor.from_pretrained(args.model)
    sources, targets = zip(*EXAMPLES, strict=True)
    example = processor(list(sources), text_target=list(targets), return_tensors="pt")
    path = export_onnx(model, args.output, example, opset_version=args.opset)
    report = {"model": args.model, "output": str(path), "encoder_type": model.config.encoder_type,
              "inputs": onnx_input_names(model.config)}
    if not args.no_check:
        report["max_abs_logit_difference"] = check(model, processor, str(path))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
