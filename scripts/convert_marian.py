#!/usr/bin/env python
"""Write an MGSA model folder from a Marian (opus-mt style) or T5 folder or Hub id.

Every Marian (T5) weight is kept; the chosen encoder variant's new modules start so that the model computes what the
source computed, as far as the variant allows (`--new-modules-init identity`, see `mgsa_hf.conversion`), or with the
variant's own initialisation (`random`). The tokenizer
(and the MGSA processor, when a parser is available) are saved beside the model so the folder is ready for fine-tuning:

    python scripts/convert_marian.py path/to/opus-mt-en-de out/opus-mt-en-de-rhe --encoder-type rhe
"""

from mgsa_hf.conversion import convert_command


if __name__ == "__main__":
    convert_command()
