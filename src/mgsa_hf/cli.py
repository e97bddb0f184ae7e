"""`mgsa-hf` command line: `mgsa-hf train` trains a translation model (by default a small en→de model on Multi30k);
`mgsa-hf demo` builds a small model of each encoder type, saves, reloads and translates."""

import argparse
import sys
import tempfile

from .training import add_train_arguments, run_train


def demo(args: argparse.Namespace) -> None:
    import torch

    from . import MgsaConfig, MgsaForConditionalGeneration

    torch.manual_seed(0)
    for encoder_type in args.encoder_types:
        config = MgsaConfig(
            vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
            pad_token_id=63, decoder_start_token_id=63, eos_token_id=0, forced_eos_token_id=0,
            encoder_type=encoder_type,
        )
        try:
            model = MgsaForConditionalGeneration(config).eval()
        except NotImplementedError as error:
            print(f"{encoder_type:>22}: {error}")
            continue
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            reloaded = MgsaForConditionalGeneration.from_pretrained(folder).eval()
        input_ids = torch.tensor([[5, 6, 7, 8, 0]])
        output = reloaded.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), num_beams=4,
                                   max_new_tokens=8)
        parameters = model.num_parameters()
        print(f"{encoder_type:>22}: {parameters:,} parameters, saved, reloaded, generated {output[0].tolist()}")


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
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
