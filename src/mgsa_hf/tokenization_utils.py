"""Tokenizers for new models and character offsets for tokenizers that return none.

[`train_joint_tokenizer`] trains one subword vocabulary on both sides of a parallel corpus and saves it as a Hugging
Face tokenizer (a fast `tokenizers` one, or Marian's SentencePiece format as in opus-mt checkpoints), so a new model
needs no Hub download. Its special tokens follow Marian: `</s>` (id 0) ends every sequence, `<unk>` is id 1 and
`<pad>` (id 2) pads and starts decoding, so a model config takes `eos_token_id=0`, `pad_token_id=2`,
`decoder_start_token_id=2` and `vocab_size=len(tokenizer)`.

[`piece_offsets`] reconstructs the character span of each SentencePiece piece, for Marian's tokenizer, which returns
no offsets in transformers 5.
"""

import gzip
import io
import json
import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path


SPECIAL_TOKENS = ("</s>", "<unk>", "<pad>")  # ids 0, 1, 2
TOKENIZER_TYPES = ("fast", "marian")
SPIECE_UNDERLINE = "\u2581"
# how far past the previous piece (and any whitespace) a piece is searched for
MAX_PIECE_SKIP = 8
_NON_SPACE = re.compile(r"\S")
# SentencePiece's trainer threads: fixed, so that every machine learns the same vocabulary (see _train_sentencepiece)
TRAINER_THREADS = 16


def read_lines(path: str | Path, max_lines: int | None = None) -> Iterator[str]:
    r"""Lines of a UTF-8 text file (gzip-compressed when the name ends in `.gz`), without line ends.

    Lines end at `\n` alone (the `\r` of a `\r\n` is dropped): a lone `\r`, form feed or U+2028 inside a line is
    text, so the lines of two files stay aligned with each other (Python's universal newlines and `str.splitlines`
    would end a line there too).

    Raises:
        `ValueError` naming the file and the line for bytes that are not UTF-8, and for a gzip file that cannot be
        decompressed (corrupt or cut short).
    """
    file = (gzip.open if str(path).endswith(".gz") else open)(path, "rb")
    number = 0
    with file:
        try:
            for number, line in enumerate(islice(file, max_lines), 1):
                try:
                    yield line.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not UTF-8 text (byte {line[error.start]:#04x} at byte "
                                     f"{error.start + 1} of the line).") from error
        except (EOFError, OSError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
            raise ValueError(f"{path}, line {number + 1}: the gzip file cannot be decompressed from here on "
                             f"(corrupt or cut short: {error}).") from error


def train_joint_tokenizer(
    source_files: str | Path | Iterable[str | Path],
    target_files: str | Path | Iterable[str | Path],
    output_dir: str | Path,
    vocab_size: int = 8000,
    tokenizer_type: str = "fast",
    max_sentences: int | None = None,
    model_max_length: int = 512,
):
    """Trains a joint unigram subword vocabulary on the source and target sides of a corpus and saves it as a Hugging
    Face tokenizer in `output_dir`, loadable with `AutoTokenizer.from_pretrained(output_dir)`.

    Args:
        source_files, target_files (`str`, `Path` or a list of them):
            Text files, one sentence per line, optionally gzip-compressed (`.gz`).
        output_dir (`str` or `Path`):
            Where the tokenizer is saved.
        vocab_size (`int`, defaults to 8000):
            Vocabulary size, special tokens included (smaller when the corpus is too small for it).
        tokenizer_type (`str`, defaults to `"fast"`):
            `"fast"`: a `tokenizers` unigram model with NFKC normalisation and `▁` word-boundary markers, saved as a
            fast tokenizer (`tokenizer.json`, returns character offsets). `"marian"`: a SentencePiece unigram model
            saved as a [`~transformers.MarianTokenizer`] (`source.spm` = `target.spm`, `vocab.json`), as in opus-mt.
        max_sentences (`int`, *optional*):
            Use only the first `max_sentences` lines of each file.
        model_max_length (`int`, defaults to 512):
            The tokenizer's `model_max_length`.

    Returns:
        The trained tokenizer.
    """
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ValueError(f"tokenizer_type must be one of {TOKENIZER_TYPES}, got {tokenizer_type!r}.")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be larger than {len(SPECIAL_TOKENS)}, got {vocab_size}.")
    files = [*_as_list(source_files), *_as_list(target_files)]
    sentences = chain.from_iterable(read_lines(file, max_sentences) for file in files)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_type == "fast":
        tokenizer = _train_fast_tokenizer(sentences, vocab_size, model_max_length)
    else:
        tokenizer = _train_marian_tokenizer(sentences, vocab_size, model_max_length, output_dir)
    tokenizer.save_pretrained(output_dir)
    return tokenizer


def _as_list(files):
    return [files] if isinstance(files, (str, Path)) else list(files)


def _train_sentencepiece(sentences, vocab_size, normalization_rule_name):
    """A SentencePiece unigram model trained on `sentences`: the bytes of its `.model` file, and the model loaded. Its
    id 0 is `<unk>`, which becomes ours (`vocab_size` counts our three special tokens).

    SentencePiece gives the same file for the same sentences and settings every time, on every machine, as long as
    its number of threads is the same (each thread sums its share of the expected counts in floating point): the
    threads are therefore fixed at [`TRAINER_THREADS`], not taken from the machine's cores. (The `tokenizers`
    unigram trainer is not deterministic: two trainings give the same pieces under different ids.)"""
    try:  # in a `try` block: transformers' check of a remote folder's imports skips it (a saved processor with a
        # fast tokenizer needs no sentencepiece)
        import sentencepiece as spm
    except ImportError as error:
        raise ImportError(f"Training a tokenizer needs `sentencepiece` ({error}): `pip install sentencepiece`.") \
            from error

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size - len(SPECIAL_TOKENS) + 1,  # the model's own <unk> becomes ours
        model_type="unigram",
        character_coverage=1.0,
        normalization_rule_name=normalization_rule_name,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        hard_vocab_limit=False,
        input_sentence_size=0,  # every sentence given (the caller draws the sample), no random subsample
        num_threads=TRAINER_THREADS,
        minloglevel=2,
    )
    return model.getvalue(), spm.SentencePieceProcessor(model_proto=model.getvalue())


def _train_fast_tokenizer(sentences, vocab_size, model_max_length):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    # SentencePiece's NFKC rule is the fast tokenizer's normaliser: the pieces are learnt on the text they will cut
    _, processor = _train_sentencepiece(sentences, vocab_size, "nfkc")
    pieces = [(token, 0.0) for token in SPECIAL_TOKENS]
    pieces += [(processor.id_to_piece(i), processor.get_score(i)) for i in range(1, processor.get_piece_size())]
    backend = Tokenizer(models.Unigram(pieces, unk_id=SPECIAL_TOKENS.index("<unk>"), byte_fallback=False))
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE)
    backend.decoder = decoders.Metaspace(replacement=SPIECE_UNDERLINE)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    eos = SPECIAL_TOKENS[0]
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, backend.token_to_id(eos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos,
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )


def _train_marian_tokenizer(sentences, vocab_size, model_max_length, output_dir):
    from transformers import MarianTokenizer

    # SentencePiece's default normaliser (NFKC and whitespace rules), as opus-mt's models
    model, processor = _train_sentencepiece(sentences, vocab_size, "nmt_nfkc")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for piece in map(processor.id_to_piece, range(processor.get_piece_size())):
        vocab.setdefault(piece, len(vocab))
    for name in ("source.spm", "target.spm"):
        (output_dir / name).write_bytes(model)
    (output_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return MarianTokenizer(
        str(output_dir / "source.spm"),
        str(output_dir / "target.spm"),
        str(output_dir / "vocab.json"),
        eos_token=SPECIAL_TOKENS[0],
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )


def missing_tokenizer_files(folder: str | Path) -> str | None:
    """Why the tokenizer of a local `folder` cannot load, when it is a file the folder lacks: a message naming the
    folder and the file(s), else `None` (not a local folder, or its files are all there).

    A `tokenizers` tokenizer (`tokenizer_config.json` naming `TokenizersBackend`, `PreTrainedTokenizerFast` or a
    model's fast class) loads from `tokenizer.json` (or a SentencePiece model its class converts); a slow one (e.g.
    `MarianTokenizer`) from its vocabulary files (`source.spm`, `target.spm`, `vocab.json`)."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    folder = Path(folder)
    if not folder.is_dir():
        return None
    config_file = folder / "tokenizer_config.json"
    has_serialized = (folder / "tokenizer.json").is_file()
    if not config_file.is_file():
        return None if has_serialized else (f"{folder} holds no tokenizer: neither tokenizer.json nor "
                                            "tokenizer_config.json; save the tokenizer (or the processor) there.")
    class_name = json.loads(config_file.read_text()).get("tokenizer_class")
    tokenizer_class = tokenizer_class_from_name(class_name) if class_name else None
    if tokenizer_class is None:
        return None
    files = dict(getattr(tokenizer_class, "vocab_files_names", {}))
    files.pop("tokenizer_config_file", None)
    if issubclass(tokenizer_class, TokenizersBackend):
        alternatives = [name for key, name in files.items() if key != "tokenizer_file"]
        if has_serialized or any((folder / name).is_file() for name in alternatives):
            return None
        return (f"{folder} has no tokenizer.json, the file its tokenizer ({class_name}, named in "
                "tokenizer_config.json) is loaded from: copy it from where the tokenizer was saved.")
    files.pop("target_vocab_file", None)  # optional: Marian's separate target vocabulary
    missing = [name for name in files.values() if not (folder / name).is_file()]
    if not missing:
        return None
    return (f"{folder} lacks {', '.join(missing)}, the vocabulary file(s) its tokenizer ({class_name}, named in "
            "tokenizer_config.json) is loaded from: copy them from where the tokenizer was saved.")


def piece_offsets(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Character spans of SentencePiece pieces in `text` (the text they were cut from), end exclusive.

    SentencePiece cuts the NFKC-normalised text (`ﬁ` → `fi`, `…` → `...`, full-width letters → ASCII), so the pieces
    are matched in the text normalised character by character, and each match is mapped back to the original
    characters it came from: a piece never points at the wrong characters. A piece without its `▁` word-boundary
    markers is matched at its first occurrence that starts at most [`MAX_PIECE_SKIP`] characters after the previous
    match and any whitespace following it. A piece that is only `▁`, or that does not occur there (a language code,
    an unknown character), gets an empty span at the current position, so the spans stay ordered.
    """
    normalized, origin = _nfkc_with_origin(text)
    spans, position = [], 0
    for piece in pieces:
        surface = unicodedata.normalize("NFKC", piece.replace(SPIECE_UNDERLINE, " ")).strip()
        if surface:
            match = _NON_SPACE.search(normalized, position)
            search_from = match.start() if match else len(normalized)
            start = normalized.find(surface, search_from, search_from + MAX_PIECE_SKIP + len(surface))
            if start >= 0:
                position = start + len(surface)
                spans.append((origin[start], origin[position - 1] + 1))
                continue
        spans.append((origin[position] if position < len(origin) else len(text),) * 2)
    return spans


def _nfkc_with_origin(text: str) -> tuple[str, list[int]]:
    """`text` NFKC-normalised one character at a time, and for each normalised character the index of the original
    character it comes from."""
    pieces, origin = [], []
    for index, character in enumerate(text):
        normalized = unicodedata.normalize("NFKC", character)
        pieces.append(normalized)
        origin.extend([index] * len(normalized))
    return "".join(pieces), origin
