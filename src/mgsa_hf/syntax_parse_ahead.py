"""Parsing beside the caller: a long batch of texts is parsed by spaCy in a forked child process
([`ParseProcess`], which shares no GIL with the caller) or on a second thread ([`ParsedAhead`]), so that the
parse overlaps the processor's work on each doc.
"""

import gc
import itertools
import multiprocessing
import os
import queue
import signal
import sys
import threading
import warnings
import weakref

import numpy as np

from .syntax_spacy import SPACY_STRINGS, UINT64_MASK, doc_attributes


def usable_cores() -> int:
    """The number of cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _ClosedWhenDropped:
    """Calls `close()` when the object is dropped. At interpreter exit, with the modules torn down, a failing `close()`
    is let go: the parse thread is a daemon, and `multiprocessing` ends its daemonic children itself."""

    def close(self):
        raise NotImplementedError

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class ParsedAhead(_ClosedWhenDropped):
    """The docs of `nlp.pipe(texts, batch_size=batch_size)`, parsed by a background thread from construction on, up to
    two batches ahead of the caller: spaCy's network and parser run largely without the GIL, so the parse overlaps
    what the caller does with each doc. The last batch is parsed in eighths, so that little of the caller's work on
    it is left after the parse ends (a doc does not depend on its batch). Iterating raises what the parse raised;
    `close()` (or dropping the iterator) stops the thread."""

    _END = object()

    def __init__(self, nlp, texts: list, batch_size: int):
        docs = _pipe_small_last_batch(nlp, texts, batch_size)
        self._ahead, self._stop = queue.Queue(2 * batch_size), threading.Event()
        # the thread holds the queue and the event, not this iterator, so that dropping the iterator stops it
        self._thread = threading.Thread(target=self._draw, args=(docs, self._ahead, self._stop),
                                        name="mgsa-spacy-parse", daemon=True)
        self._thread.start()

    @classmethod
    def _draw(cls, docs, ahead, stop):
        def offer(entry) -> bool:
            while not stop.is_set():
                try:
                    ahead.put(entry, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for doc in docs:
                if not offer((doc, None)):
                    return
            offer((cls._END, None))
        except BaseException as error:  # handed to the caller, which raises it
            offer((cls._END, error))

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        doc, error = self._ahead.get()
        if doc is self._END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return doc

    def close(self):
        """Stops the parse thread and waits for it (unless called from it)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _pipe_small_last_batch(nlp, texts: list, batch_size: int):
    """`nlp.pipe(texts, batch_size=batch_size)` with the last batch parsed in eighths, so that little of a
    consumer's work on it is left after the parse ends (a doc does not depend on its batch)."""
    tail = min(batch_size, len(texts))
    return itertools.chain(
        nlp.pipe(texts[: len(texts) - tail], batch_size=batch_size),
        nlp.pipe(texts[len(texts) - tail :], batch_size=max(1, batch_size // 8)),
    )


def can_fork_parse(inputs: list) -> bool:
    """Whether a [`ParseProcess`] can parse `inputs`: Linux's `fork`, a process that may have children (not a
    daemonic `multiprocessing` worker), spaCy on the CPU (a child must not use the GPU) and texts (the docs made from
    given trees stay here)."""
    if not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        return False
    try:  # spaCy's array library; in a `try` block for transformers' check of remote code (see `import_spacy`)
        from thinc.api import NumpyOps, get_current_ops
    except ImportError:  # no spaCy: nothing to parse
        return False
    return isinstance(get_current_ops(), NumpyOps) and all(isinstance(text, str) for text in inputs)


_DOCS_PER_MESSAGE = 32
# the parse processes' pipe ends held by this process: a process forked later closes them (see `_detach`)
_PARENT_ENDS = weakref.WeakSet()
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _detach(own_end, owner: int, from_main_thread: bool) -> None:
    """
    Make a forked parse process end with its parent. It closes the pipe ends it inherited from its parent (its
    parent's end of its own pipe and of other parse processes'), so that it reads the end of its pipe when the parent
    is gone; on Linux it asks the kernel for SIGKILL when the parent ends (`PR_SET_PDEATHSIG`; only when forked by the
    main thread, as the signal follows the forking thread). Its standard output goes to /dev/null: a parse prints
    nothing, and a reader of the parent's output (`... | cat`) then waits for no other process.
    """
    for end in list(_PARENT_ENDS):
        end.close()
    own_end.close()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    if from_main_thread and sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the closed pipe ends it when it next reads or writes
            pass
    if os.getppid() != owner:  # the parent ended before the request was made
        os._exit(0)


class ParseProcess(_ClosedWhenDropped):
    """A child process forked from this one that parses texts with the spaCy pipeline it inherited, for one
    [`SyntaxParser`]: the parse then runs beside the caller's work on each doc without sharing the GIL with it. It is
    forked once and serves every long batch of its parser (a child forked per batch parsed about a tenth slower, most
    likely from copying the pages that the parse writes to); it ends with its parser, with this process (also killed,
    or a `Dataset.map` worker that ends without its clean-up; see [`_detach`]), or when a caller stops reading a batch
    early.

    [`parse`] sends the texts and returns an iterator over the docs' [`doc_attributes`] arrays, which the child sends
    in messages of a few docs with the strings of the tag and label hashes it has not sent before; the last batch is
    parsed in eighths (see [`_pipe_small_last_batch`]). Iterating raises what the parse raised."""

    def __init__(self, nlp):
        context = multiprocessing.get_context("fork")
        self._connection, child_connection = context.Pipe()
        self._owner = os.getpid()
        detach = (self._connection, self._owner, threading.current_thread() is threading.main_thread())
        self._process = context.Process(target=self._serve, args=(nlp, child_connection, detach),
                                        name="mgsa-spacy-parse", daemon=True)
        with warnings.catch_warnings():
            # Python >= 3.12 warns that a fork with threads alive may deadlock in the child; this child takes no lock
            # of those threads (it runs spaCy's CPU pipeline and writes to its pipe)
            warnings.filterwarnings("ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning)
            self._process.start()
        child_connection.close()
        _PARENT_ENDS.add(self._connection)
        self.busy = False

    @property
    def owned(self) -> bool:
        """Whether this process forked it (a forked copy of its parser holds it too, and may not use it)."""
        return self._owner == os.getpid()

    @property
    def usable(self) -> bool:
        """Whether this process may send it a batch now: its own child, alive and idle."""
        return self.owned and not self.busy and self._process.is_alive()

    def parse(self, texts: list[str], batch_size: int) -> "_ProcessParsedBatch":
        """Sends `texts` to the child and returns the iterator over their docs' arrays (see the class)."""
        self.busy = True
        self._connection.send((texts, batch_size))
        return _ProcessParsedBatch(self)

    def receive(self):
        """The next message of the batch being parsed: `("docs", (strings, lengths, data))`, `("end", None)` or
        `("error", exception)`."""
        try:
            return self._connection.recv()
        except EOFError:
            raise RuntimeError(
                f"The spaCy parse process ended without its result (exit code {self._process.exitcode})."
            ) from None

    def close(self):
        """Ends the child (only from the process that forked it)."""
        if self.owned and self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._connection.close()

    @staticmethod
    def _serve(nlp, connection, detach):
        _detach(*detach)
        try:
            ParseProcess._answer(nlp, connection)
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone
            pass

    @staticmethod
    def _answer(nlp, connection):
        gc.freeze()  # collections here skip the objects inherited from the parent, whose pages they would copy
        gc.enable()
        attributes, sent = doc_attributes(), set()

        def send(arrays):
            data = np.concatenate(arrays)
            keys = set(data[:, 1:3].view(np.int64).ravel().tolist()) - sent
            strings = {key: nlp.vocab.strings[key & UINT64_MASK] for key in keys}
            sent.update(keys)
            connection.send(("docs", (strings, [len(array) for array in arrays], data)))

        while True:
            try:
                texts, batch_size = connection.recv()
            except EOFError:  # the parser is gone
                return
            arrays = []
            try:
                for doc in _pipe_small_last_batch(nlp, texts, batch_size):
                    arrays.append(doc.to_array(attributes))
                    if len(arrays) == _DOCS_PER_MESSAGE:
                        send(arrays)
                        arrays = []
                if arrays:
                    send(arrays)
                connection.send(("end", None))
            except BaseException as error:  # handed to the caller after the docs parsed before it, and raised there
                if arrays:
                    send(arrays)
                try:
                    connection.send(("error", error))
                except Exception:  # not picklable: its type and message
                    connection.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))


class _ProcessParsedBatch(_ClosedWhenDropped):
    """The arrays of one batch sent to a [`ParseProcess`], in order. Closing it (or dropping it) before its end ends
    the process, whose remaining messages would otherwise be read by the next batch."""

    def __init__(self, process: ParseProcess):
        self._process, self._docs, self._finished = process, iter(()), False

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        for array in self._docs:
            return array
        if self._finished:
            raise StopIteration
        try:
            kind, payload = self._process.receive()
        except BaseException:
            self.close()
            raise
        if kind == "docs":
            strings, lengths, data = payload
            SPACY_STRINGS.update(strings)
            self._docs = iter(np.split(data, np.cumsum(lengths[:-1])))
            return next(self)
        self._finished, self._process.busy = True, False
        if kind == "error":
            raise payload
        raise StopIteration

    def close(self):
        if not self._finished:
            self._finished, self._process.busy = True, False
            self._process.close()
