"""Checks of what a model and the processor are given: token ids before they reach an embedding
(`check_token_ids`), and the processor's text and tree arguments (`as_text_batch`, `check_tree_batch`).

An id at or beyond the embedding's rows fails inside torch with `IndexError: index out of range in self` (on a GPU, a
device-side assert that ends the process), and a list or a 1-d tensor as `input_ids` with an `AttributeError` or an
`IndexError` deep inside the model. These checks name the field, the id and the vocabulary instead.
"""

import torch


def check_token_ids(token_ids, vocab_size: int, name: str) -> None:
    """
    Raise a clear error unless `token_ids` is a (batch_size, sequence_length) tensor of integer ids in
    `[0, vocab_size)`: a `TypeError` for a list or a floating-point tensor, a `ValueError` for another shape or an id
    out of range (read back once; not checked while compiled, exported or traced, where the graph stays as it is).

    Args:
        token_ids: the ids given to the model.
        vocab_size: the rows of the embedding that reads them.
        name: the argument's name in the error, e.g. `input_ids`.
    """
    if not torch.is_tensor(token_ids) or token_ids.is_floating_point() or token_ids.is_complex():
        kind = type(token_ids).__name__ if not torch.is_tensor(token_ids) else f"{token_ids.dtype} tensor"
        raise TypeError(
            f"`{name}` must be a 2-d LongTensor batch of token ids (batch_size, sequence_length), got a {kind}: "
            "pass the tokenizer's or processor's output with `return_tensors='pt'`."
        )
    if token_ids.dim() != 2:
        hint = " (one sentence: `ids.unsqueeze(0)`)" if token_ids.dim() == 1 else ""
        raise ValueError(
            f"`{name}` must be a 2-d LongTensor batch of token ids (batch_size, sequence_length), got a tensor of "
            f"shape {tuple(token_ids.shape)}{hint}."
        )
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing():
        return
    if not token_ids.numel():
        return
    low, high = torch.stack(torch.aminmax(token_ids)).tolist()
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` holds the token id {high if high >= vocab_size else low}, but the model's vocabulary has "
            f"`vocab_size` = {vocab_size} ids (0 to {vocab_size - 1}): the ids come from a tokenizer larger than the "
            "model's vocabulary, or another model's; use the model's own tokenizer (or resize the embeddings with "
            "`model.resize_token_embeddings(len(tokenizer))`)."
        )


def check_tokenizer_fits(tokenizer, model, where: str) -> None:
    """Raise a `ValueError` when `tokenizer` has more ids than `model`'s input embedding has rows (ids beyond them
    would reach the embedding); `where` names the pairing, e.g. "the translation pipeline"."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise ValueError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model ({model.name_or_path or 'given'}) "
            f"embeds {rows} (`vocab_size`): pair the model with its own tokenizer or processor (saved in its "
            "folder), or resize the embeddings with `model.resize_token_embeddings(len(tokenizer))`."
        )


def as_text_batch(text, name) -> tuple[list[str], bool]:
    """`text` as a list of strings, and whether it was one."""
    if isinstance(text, str):
        check_unicode(text, name)
        return [text], False
    if not isinstance(text, (list, tuple)):
        raise TypeError(f"`{name}` must be a string or a list of strings, got {type(text).__name__}.")
    if not text:
        raise ValueError(f"`{name}` is an empty list.")
    for i, item in enumerate(text):
        if not isinstance(item, str):
            raise TypeError(f"`{name}[{i}]` must be a string, got {type(item).__name__}.")
        check_unicode(item, f"{name}[{i}]")
    return list(text), True


def check_unicode(text: str, name: str) -> None:
    """A `ValueError` naming `name` for a string that is not Unicode text: a lone surrogate (from a `surrogateescape`
    decode, or a `\\ud800` escape), which no tokenizer or parser can read."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"`{name}` is not valid Unicode text: {error.reason} at character {error.start} "
                         f"({text[error.start]!r}).") from None


def check_tree_batch(trees, texts, is_batched) -> list[str | None] | None:
    """The processor's `trees` as a list beside `texts` (None: every tree derived), or a clear error for another
    type or count."""
    if trees is None:
        return None
    if not is_batched:
        trees = [trees]
    elif not isinstance(trees, (list, tuple)):
        raise TypeError(f"`trees` must be a list of PTB strings (or None) like `text`, got {type(trees).__name__}.")
    if len(trees) != len(texts):
        raise ValueError(f"Got {len(texts)} sentences but {len(trees)} trees.")
    for i, tree in enumerate(trees):
        if tree is not None and not isinstance(tree, str):
            raise TypeError(f"`trees[{i}]` must be a PTB bracketed string or None, got {type(tree).__name__}.")
    return list(trees)


def check_text_lengths(texts: list[str], limit: int) -> None:
    """Raises a `ValueError` naming the first text longer than the parser takes (`limit` characters)."""
    for i, source in enumerate(texts):
        if len(source) > limit:
            raise ValueError(f"text[{i}] has {len(source):,} characters, more than the parser takes ({limit:,}, "
                             "spaCy's `max_length`): split it into sentences.")
