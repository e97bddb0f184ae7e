#!/usr/bin/env python
"""Train an MGSA translation model with Seq2SeqTrainer (see `mgsa_hf.training`).

    python scripts/train.py                                   # the packaged Multi30k en→de CPU config
    python scripts/train.py configs/train/multi30k_gpu.yaml model.encoder_type=rhe
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml \
        scripts/train.py configs/train/multi30k_gpu.yaml
"""

import argparse

from mgsa_hf.training import add_train_arguments, run_train


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser)
    run_train(parser.parse_args(argv))


if __name__ == "__main__":
    main()
