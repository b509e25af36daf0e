"""Tokenizers as ExecuTorch's LLM runner loads them, detected from the file.

:func:`load_tokenizer` tries the formats in the order ExecuTorch's runner does:

1. Hugging Face ``tokenizer.json`` (a ``.json`` file, or a directory holding one), read
   with the ``tokenizers`` library; BOS and EOS come from ``tokenizer_config.json`` beside
   it when present (``bos_token`` / ``eos_token``), else from well-known special tokens;
2. tiktoken BPE files (lines of ``base64-token rank``), through ``pytorch-tokenizers``
   with Llama 3's special tokens, as ExecuTorch's runner loads them;
3. SentencePiece models (``tokenizer.model``), through ``pytorch-tokenizers``;
4. llama2.c tokenizer binaries (``tokenizer.bin``), through ``pytorch-tokenizers``.

Every tokenizer has the same small interface (:class:`Tokenizer`): ``encode(text, bos,
eos)`` with counts of BOS/EOS tokens to add, ``decode(ids)`` of a whole sequence, and
``bos_id``, ``eos_id``, ``vocab_size`` (one past the largest id). :class:`TextStream` turns a growing list of ids
into text pieces for streaming, holding back bytes that do not yet form a whole character.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import TokenizerError
from .bpe import LONG_PIECE, merge, read_ranks

__all__ = ["TextStream", "Tokenizer", "load_tokenizer"]

# Special tokens a Hugging Face tokenizer may use for BOS and EOS, most specific first.
_HF_BOS = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|im_start|>")
_HF_EOS = ("<|end_of_text|>", "<|eot_id|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>")


class Tokenizer:
    """Text <-> token ids. Subclasses implement :meth:`_encode` and :meth:`decode`."""

    kind = "tokenizer"

    def __init__(self, path: Path, bos_id: int, eos_id: int, vocab_size: int) -> None:
        self.path = path
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.vocab_size = vocab_size

    def encode(self, text: str, bos: int = 0, eos: int = 0) -> list[int]:
        """The ids of ``text``, with ``bos`` BOS tokens before and ``eos`` EOS after
        (:class:`~ptexec.errors.TokenizerError` when asked for one the tokenizer has not, or
        for a text that is no UTF-8: one holding a lone surrogate)."""
        for n, token, name in ((bos, self.bos_id, "BOS"), (eos, self.eos_id, "EOS")):
            if n > 0 and token < 0:
                raise TokenizerError(f"{self.path.name} has no {name} token to put {n} of")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # (the libraries' own refusals call it no str)
            raise TokenizerError(
                f"the text holds a lone surrogate, U+{ord(text[e.start]):04X} at character "
                f"{e.start}: it is no UTF-8 text, which the {self.kind} tokenizer "
                f"{self.path.name} encodes"
            ) from None
        return [self.bos_id] * bos + self._encode(text) + [self.eos_id] * eos

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of a sequence of ids."""
        raise NotImplementedError

    def is_special(self, token: int) -> bool:
        """Whether ``token`` is a control token (BOS, EOS, ...), not text."""
        return token in (self.bos_id, self.eos_id)

    def token_bytes(self, token: int) -> bytes:
        """The UTF-8 bytes ``token`` stands for in a text: for a token that holds part of a
        character, those bytes (which are no text alone); a control token's, its name's."""
        return self.decode([token]).encode("utf-8")

    def __repr__(self) -> str:
        return (
            f"<ptexec.llm {self.kind} tokenizer {self.path.name}: vocab {self.vocab_size}, "
            f"bos {self.bos_id}, eos {self.eos_id}>"
        )


class HuggingFaceTokenizer(Tokenizer):
    """A ``tokenizer.json`` read by the ``tokenizers`` library."""

    kind = "Hugging Face"

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TokenizerError(
                "reading a tokenizer.json needs the 'tokenizers' package "
                "(pip install '.[llm]' in ptexec's source tree)"
            ) from e
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({e})") from e
        # a file saved with truncation or padding on (a training script's) would cut or pad
        # every prompt: transformers' tokenizers switch both off unless a call asks
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        bos, eos = _hf_special_ids(tok, path.parent / "tokenizer_config.json")
        added = tok.get_added_tokens_decoder()
        try:
            spec = json.loads(tok.to_str())
        except ValueError:
            spec = {}
        # the id range: ids may have gaps (the vocabulary's, or added tokens past the
        # count), so the count of entries may fall short of it
        size = max(
            [
                tok.get_vocab_size(with_added_tokens=True),
                _vocab_end(spec),
                *(int(i) + 1 for i in added),
            ]
        )
        super().__init__(path, bos, eos, size)
        self._special = frozenset(int(i) for i, t in added.items() if t.special)
        self._added = frozenset(int(i) for i in added)
        self._pieces = _piece_rules(spec)

    def _encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def is_special(self, token: int) -> bool:
        return token in self._special or super().is_special(token)

    def token_bytes(self, token: int) -> bytes:
        # a vocabulary entry's bytes by the decoder's own rules (decoding the id alone gives
        # U+FFFD for part of a character, and may strip a leading space)
        piece = None if token in self._added else self._tok.id_to_token(token)
        if piece is not None:
            data = _piece_bytes(piece, self._pieces)
            if data is not None:
                return data
        return super().token_bytes(token)

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (what other libraries read)."""
        return str(self._tok.to_str())


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters (GPT-2's): each byte is a printable character, itself
    where Latin-1 prints it, else the next code point from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shown = set(printable)
    out = {chr(b): b for b in printable}
    extra = 0x100
    for b in range(256):
        if b not in shown:
            out[chr(extra)] = b
            extra += 1
    return out


_BYTE_OF = _byte_alphabet()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _vocab_end(spec: Any) -> int:
    """One past the largest id of a ``tokenizer.json``'s model vocabulary (``spec``, the
    parsed file): a map of pieces to ids may have gaps, a list (Unigram's) has none."""
    model = spec.get("model") if isinstance(spec, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        return max((int(i) + 1 for i in vocab.values() if isinstance(i, int)), default=0)
    return len(vocab) if isinstance(vocab, list) else 0


def _piece_rules(spec: Any) -> frozenset[str]:
    """Which of the decoder's rules for one vocabulary entry apply: ``"bytes"`` (byte-level
    BPE), ``"fallback"`` (``<0xNN>`` entries are bytes), ``"space"`` (U+2581 is a space);
    ``spec`` is the parsed ``tokenizer.json``."""
    decoder = (spec.get("decoder") if isinstance(spec, dict) else None) or {}
    steps = decoder.get("decoders") or [decoder] if isinstance(decoder, dict) else []
    rules = set()
    for step in steps:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "ByteLevel":
            rules.add("bytes")
        elif kind == "ByteFallback":
            rules.add("fallback")
        elif kind == "Metaspace" or (
            kind == "Replace" and step.get("content") == " "
            and (step.get("pattern") or {}).get("String") == "\u2581"
        ):  # fmt: skip
            rules.add("space")
    return frozenset(rules)


def _piece_bytes(piece: str, rules: frozenset[str]) -> bytes | None:
    """A vocabulary entry's bytes under ``rules`` (:func:`_piece_rules`); None: no rule
    gives them."""
    if "bytes" in rules:
        try:
            return bytes(_BYTE_OF[c] for c in piece)
        except KeyError:
            return None
    if "fallback" in rules:
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
    if "space" in rules:
        return piece.replace("\u2581", " ").encode("utf-8")
    return None


def _hf_special_ids(tok: Any, config_path: Path) -> tuple[int, int]:
    def token_id(entry: Any) -> int | None:
        if isinstance(entry, dict):  # {"content": "<s>", ...}
            entry = entry.get("content")
        if not isinstance(entry, str):
            return None
        found = tok.token_to_id(entry)
        return int(found) if found is not None else None

    bos = eos = None
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{config_path}: unreadable tokenizer config ({e})") from e
        if not isinstance(config, dict):
            raise TokenizerError(f"{config_path}: the tokenizer config is not a JSON object")
        bos, eos = token_id(config.get("bos_token")), token_id(config.get("eos_token"))
    # a config that says null has none (Qwen's BOS): only a token not named is guessed
    if bos is None and config.get("bos_token", "") is not None:
        bos = next((i for i in map(token_id, _HF_BOS) if i is not None), None)
    if eos is None and config.get("eos_token", "") is not None:
        eos = next((i for i in map(token_id, _HF_EOS) if i is not None), None)
    # no BOS/EOS at all: the ids stay usable (-1 is never generated)
    return (bos if bos is not None else -1), (eos if eos is not None else -1)


# SentencePiece's piece types (sentencepiece_model.proto)
_SP_CONTROL, _SP_BYTE = 3, 6


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a truncated varint")
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """A protobuf message's fields: (number, wire type, bytes or integer); ValueError for
    anything malformed."""
    out: list[tuple[int, int, bytes | int]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            out.append((number, wire, value))
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("a truncated field")
            out.append((number, wire, data[at : at + size]))
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            if at > len(data):
                raise ValueError("a truncated field")
        else:
            raise ValueError(f"wire type {wire}")
    return out


class SentencePieceModel(NamedTuple):
    """What ptexec reads of a SentencePiece ``tokenizer.model`` itself: its pieces in id
    order with their types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    6 byte), and its normalizer's two space rules (protobuf defaults: both true)."""

    pieces: list[tuple[str, int]]
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool


def sentencepiece_model(path: Path) -> SentencePieceModel | None:
    """The pieces and space rules of a SentencePiece ``tokenizer.model``; None when the
    file is not such a model."""
    try:
        data = path.read_bytes()
        pieces = []
        spaces = {3: True, 4: True}  # the normalizer's add_dummy_prefix, remove_extra_whitespaces
        for number, wire, value in _fields(data):
            if wire != 2 or number not in (1, 3):
                continue
            assert isinstance(value, bytes)
            if number == 3:  # the normalizer
                for n, w, v in _fields(value):
                    if n in spaces and w == 0 and isinstance(v, int):
                        spaces[n] = bool(v)
                continue
            name, kind = "", 1
            for n, w, v in _fields(value):
                if n == 1 and w == 2 and isinstance(v, bytes):
                    name = v.decode("utf-8")
                elif n == 3 and w == 0 and isinstance(v, int):
                    kind = v
            pieces.append((name, kind))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return SentencePieceModel(pieces, spaces[3], spaces[4])


def sentencepiece_pieces(path: Path) -> list[tuple[str, int]] | None:
    """The pieces of a SentencePiece ``tokenizer.model`` (:func:`sentencepiece_model`)."""
    model = sentencepiece_model(path)
    return model.pieces if model is not None else None


def _signed(token: Any) -> int:
    """A token id from ``pytorch-tokenizers``, which hands ids over unsigned: a model
    without BOS (sentencepiece's ``bos_id`` -1, T5's) is 2**64 - 1 there, -1 here."""
    value = int(token)
    return value - (1 << 64) if value >= 1 << 63 else value


class _CppTokenizer(Tokenizer):
    """A tokenizer of ``pytorch-tokenizers`` (the C++ ones ExecuTorch's runner uses)."""

    def __init__(self, path: Path, impl: Any, kind: str) -> None:
        self.kind = kind
        self._impl = impl
        super().__init__(
            path, _signed(impl.bos_tok()), _signed(impl.eos_tok()), int(impl.vocab_size())
        )
        # tiktoken's special tokens (Llama 3's: BOS first) follow the regular ones
        self._first_special = self.bos_id if kind == "tiktoken" else self.vocab_size
        self._control: frozenset[int] = frozenset()
        self._bytes: dict[int, bytes] = {}  # byte-fallback pieces (<0xNN>): their byte
        self._split: re.Pattern[str] | None = None
        self._named: dict[str, int] = {}
        self._names: dict[int, bytes] = {}
        self._pieces: Any = None  # tiktoken: its pre-tokenizer, done here (_LLAMA3_PATTERN)
        self._rank_table: dict[bytes, int] | None = None  # tiktoken: see _ranks
        if kind == "tiktoken":
            self._named = {name: self.bos_id + i for i, name in enumerate(_llama3_special_names())}
            self._split = re.compile(
                "(" + "|".join(map(re.escape, sorted(self._named, key=len, reverse=True))) + ")"
            )
            self._pieces = _pretokenizer(_LLAMA3_PATTERN)
        model = sentencepiece_model(path) if kind == "SentencePiece" else None
        # the leading spaces a decode drops (sentencepiece's rule): the text's first space,
        # when its encode adds one or collapses spaces; with spaces collapsed, one of each
        # piece until one leaves text (spaces before the text are the encode's alone)
        self._drop_first_space = kind == "SentencePiece" and (
            model is None or model.add_dummy_prefix or model.remove_extra_whitespaces
        )
        self._collapsed = model is None or model.remove_extra_whitespaces
        pieces = model.pieces if model is not None else None
        if pieces is not None and len(pieces) == self.vocab_size:
            self._control = frozenset(i for i, (_, k) in enumerate(pieces) if k == _SP_CONTROL)
            for i, (name, k) in enumerate(pieces):
                m = _BYTE_PIECE.fullmatch(name) if k == _SP_BYTE else None
                if m:
                    self._bytes[i] = bytes([int(m.group(1), 16)])
            # control pieces written in a text (a chat template's <s>, </s>) are their ids,
            # as transformers' tokenizers of the same model read them
            self._named = {pieces[i][0]: i for i in sorted(self._control) if pieces[i][0]}
            self._names = {i: name.encode() for name, i in self._named.items()}
            if self._named:
                names = sorted(self._named, key=len, reverse=True)
                self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")")

    def is_special(self, token: int) -> bool:
        return token >= self._first_special or token in self._control or super().is_special(token)

    def _encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._encode_text(text)
        ids: list[int] = []
        for k, part in enumerate(self._split.split(text)):
            if k % 2:
                ids.append(self._named[part])
            elif part:
                ids.extend(self._encode_text(part))
        return ids

    def _encode_text(self, text: str) -> list[int]:
        encode = self._impl.encode
        if self._pieces is None:
            # pytorch-tokenizers' SentencePiece and llama2.c encodes end a text at a NUL
            # and drop the rest (sentencepiece's own encodes the whole text, which cannot
            # be done through them): refused rather than cut
            nul = text.find("\x00")
            if nul >= 0:
                raise TokenizerError(
                    f"the text holds U+0000 (NUL) at character {nul}: the {self.kind} "
                    f"tokenizer {self.path.name} ends a text there"
                )
            return [int(i) for i in encode(text, 0, 0)]
        # each piece of the pre-tokenizer alone: the library's split of a piece is the piece;
        # a long one is merged in n log n (bpe.merge: the library's merges take n**2)
        ids: list[int] = []
        for piece in self._pieces.findall(text):
            data = piece.encode() if len(piece) * 4 > LONG_PIECE else b""
            if len(data) > LONG_PIECE:
                ranks = self._ranks()
                whole = ranks.get(data)
                ids.extend([whole] if whole is not None else merge(data, ranks))
            else:
                ids.extend(int(i) for i in encode(piece, 0, 0))
        return ids

    def _ranks(self) -> dict[bytes, int]:
        """The tiktoken file's tokens by their bytes (read on first use)."""
        if self._rank_table is None:
            self._rank_table = read_ranks(self.path)
        return self._rank_table

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        # pieces are bytes; join them first so characters split over tokens survive
        pieces = [self._piece(int(i), skip_special_tokens) for i in ids]
        if self._drop_first_space:
            # SentencePiece's decode drops the space its encode put before the text
            # (control pieces are no text: they neither end that nor lose anything; a
            # byte piece's space is a byte of the text)
            for k, i in enumerate(ids):
                if int(i) in self._control:
                    continue
                dropped = pieces[k][:1] == b" " and int(i) not in self._bytes
                if dropped:
                    pieces[k] = pieces[k][1:]
                if pieces[k] or (dropped and not self._collapsed):
                    break
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return self._piece(token, False)

    def _piece(self, token: int, skip: bool) -> bytes:
        if skip and self.is_special(token):
            return b""
        if not 0 <= token < self.vocab_size:
            raise TokenizerError(
                f"token id {token} is outside the vocabulary [0, {self.vocab_size})"
            )
        byte = self._bytes.get(token)
        if byte is not None:
            return byte
        if token in self._control:  # a control piece is no text: its name
            return self._names.get(token, b"")
        try:
            piece = self._impl.decode(token)
        except UnicodeDecodeError as e:  # a piece that is part of a character
            return bytes(e.object)
        except Exception as e:
            raise TokenizerError(f"{self.path}: cannot decode token {token} ({e})") from e
        return piece.encode("utf-8", errors="surrogateescape") if isinstance(piece, str) else piece


def _pretokenizer(pattern: str) -> Any:
    """``pattern`` compiled by the ``regex`` module (Unicode classes, look-ahead)."""
    try:
        import regex
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise TokenizerError(
            "a tiktoken tokenizer needs the 'regex' package (pip install '.[llm]' in "
            "ptexec's source tree)"
        ) from e
    return regex.compile(pattern)


def _sniff_tiktoken(path: Path) -> bool:
    """A tiktoken BPE file: text lines of ``<base64> <rank>``."""
    import base64
    import binascii

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    lines = head.splitlines()[:8]
    if not lines:
        return False
    for line in lines[:-1] if len(head) == 4096 else lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            return False
        try:
            base64.b64decode(parts[0], validate=True)
        except binascii.Error:
            return False
    return True


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer in ``path`` (a file, or a directory holding ``tokenizer.json`` or
    ``tokenizer.model``), its format detected from the file. Raises
    :class:`~ptexec.errors.TokenizerError` naming the formats tried."""
    p = Path(path)
    if p.is_dir():
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer.bin"):
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise TokenizerError(
                f"Failed to load tokenizer: {path} is a directory without tokenizer.json, "
                "tokenizer.model or tokenizer.bin"
            )
    if not p.is_file():
        raise TokenizerError(f"Failed to load tokenizer: {path} does not exist")
    tried: list[str] = []
    if p.suffix == ".json" or _looks_like_json(p):
        try:
            return HuggingFaceTokenizer(p)
        except TokenizerError as e:
            tried.append(str(e))
    try:
        import pytorch_tokenizers as pt
    except ImportError:
        raise TokenizerError(
            f"Failed to load tokenizer {p}: it is not a Hugging Face tokenizer.json, and "
            "tiktoken, SentencePiece and llama2.c tokenizers need 'pytorch-tokenizers' "
            "(pip install '.[llm]' in ptexec's source tree)"
        ) from None
    if _sniff_tiktoken(p):
        impl = _llama3_tiktoken(pt)
        if _load(impl, p):
            return _CppTokenizer(p, impl, "tiktoken")
        tried.append("tiktoken: the file did not load")
    for cls, kind in ((pt.CppSPTokenizer, "SentencePiece"), (pt.CppLlama2cTokenizer, "llama2.c")):
        impl = cls()
        if _load(impl, p):
            return _CppTokenizer(p, impl, kind)
        tried.append(f"{kind}: the file did not load")
    raise TokenizerError(
        f"Failed to load tokenizer {p}: not a Hugging Face tokenizer.json, tiktoken, "
        f"SentencePiece or llama2.c file ({'; '.join(tried)})"
    )


def _looks_like_json(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(64).lstrip()[:1] == b"{"
    except OSError:
        return False


def _load(impl: Any, p: Path) -> bool:
    try:
        impl.load(str(p))
    except Exception:
        return False
    return bool(impl.is_loaded())


def _llama3_tiktoken(pt: Any) -> Any:
    """A tiktoken tokenizer with Llama 3's 256 special tokens (BOS 128000, EOS 128001 once
    the 128000 regular tokens are loaded), as ExecuTorch's Llama runner builds it."""
    return pt.CppTiktoken(_llama3_special_names(), 0, 1)


# Llama 3's pre-tokenizer pattern (tiktoken's, with cl100k's rules): a text is cut into
# these pieces before byte-pair encoding. pytorch-tokenizers' engine has no look-ahead,
# so its own split of a run of spaces before a word differs (``\s+(?!\S)``).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _llama3_special_names() -> list[str]:
    """Llama 3's 256 special tokens, in id order from BOS."""
    names = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    names += [f"<|reserved_special_token_{i}|>" for i in range(2, 256 - len(names) + 2)]
    return names


class TextStream:
    """Text pieces of a growing token sequence, for streaming.

    :meth:`push` adds one id and returns the new text since the last piece (possibly
    empty). Each piece is the difference between two decodes that start at the same id: of
    the ids given out before, and of all ids; so merges, leading spaces and characters
    split over several tokens (byte-level and byte-fallback vocabularies) come out as a
    decode of the whole sequence has them. ``context``: the ids before the first pushed one
    (the prompt's): the decodes start in it, so a decoder's rule for the start of a text
    (SentencePiece's dropped first space) does not touch the first piece, which is the text
    a decode of prompt and completion has after the prompt's. Text up to a partial
    character (U+FFFD at the end) is given at once, the partial character when the bytes
    that complete it arrive; :meth:`flush` gives what is held back. Control tokens are not
    text and give no piece.
    """

    REBASE = 4  # decodes start again at the last id past this many (short decodes: measured)

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = _whole_tail(tokenizer, context)
        self._given = len(self._decode())  # characters of the decode given out (or context)

    def _decode(self) -> str:
        return self._tok.decode(self._ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        if self._tok.is_special(token):
            return ""
        self._ids.append(token)
        return self._piece(final=False)

    def flush(self) -> str:
        """Whatever is held back (a partial character, as U+FFFD)."""
        piece = self._piece(final=True)
        self._ids.clear()
        self._given = 0
        return piece

    def _piece(self, final: bool) -> str:
        text = self._decode()
        whole = text if final else text.rstrip("\ufffd")
        # (a decoder that rewrote text given out already: the rest, by length; what was
        # given out stays given)
        piece = whole[self._given :] if len(whole) > self._given else ""
        self._given = max(self._given, len(whole))
        if not final and len(whole) == len(text) and len(self._ids) > self.REBASE:
            # keep the decodes short: start again at the last id, when it is whole text
            # (not at one that is no text alone, a lone space piece: a SentencePiece
            # decode starting there drops the next piece's space as well)
            tail = self._ids[-1:]
            alone = self._tok.decode(tail, skip_special_tokens=True)
            if alone and "\ufffd" not in alone:
                self._ids = tail
                self._given = len(alone)
        return piece


def _whole_tail(tokenizer: Tokenizer, context: Sequence[int], most: int = 8) -> list[int]:
    """The shortest end of ``context`` (at most ``most`` ids) whose decode is text, whole
    characters only; else the shortest end of non-special ids that decodes to no text
    (a prompt of one space: the completion's first space is not at the text's start);
    else none."""
    empty: list[int] = []  # the shortest end that is no text (a prompt of one space)
    for n in range(1, min(most, len(context)) + 1):
        tail = [int(i) for i in context[-n:]]
        text = tokenizer.decode(tail, skip_special_tokens=True)
        if "\ufffd" in text:
            continue
        if text:
            return tail
        if not empty and not any(tokenizer.is_special(i) for i in tail):
            empty = tail
    return empty
