"""`mgsa-hf` command line: `mgsa-hf train` trains a translation model (by default a small en→de model on Multi30k);
`mgsa-hf prepare` tokenizes and parses a recipe's corpus once, on disk, before training; `mgsa-hf demo` builds a
small model of each encoder type, saves, reloads and translates."""

import argparse
import sys
import tempfile

from .corpus_preparation import add_prepare_arguments, run_prepare
from .training import add_train_arguments, run_train


def positive_int(text: str) -> int:
    """argparse type of a count of at least 1 (the scripts' batch sizes, beams, lengths, jobs and threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


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

    from . import MgsaConfig, MgsaForConditionalGeneration, MgsaProcessor
    from .tokenization_utils import train_joint_tokenizer

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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="mgsa-hf", description="phrase- and syntax-aware NMT encoders")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="build, save, reload and run a small model of each encoder type")
    demo_parser.add_argument(
        "--encoder-types", nargs="*",
        default=["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"],
    )
    demo_parser.set_defaults(func=demo)
    train_parser = commands.add_parser(
        "train", help="train a translation model (Seq2SeqTrainer); see mgsa_hf.training"
    )
    add_train_arguments(train_parser)
    train_parser.set_defaults(func=run_train)
    prepare_parser = commands.add_parser(
        "prepare", help="tokenize and parse a recipe's corpus once, on disk, before training; see "
                        "mgsa_hf.corpus_preparation"
    )
    add_prepare_arguments(prepare_parser)
    prepare_parser.set_defaults(func=run_prepare)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
