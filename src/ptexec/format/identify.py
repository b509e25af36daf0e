"""What a file is when it is not the ExecuTorch file that was expected.

People hand a runtime the file next to the right one: the PyTorch checkpoint the model was
trained into, the ``torch.export`` archive it was exported to, the ``.ptd`` beside the
``.pte``, a download that saved a web page or a Git LFS pointer, a file that was never
written. :func:`describe` recognises these from a few bytes at the start (and, for a zip
archive, at the end) and says what the file is and what to do; it never raises and reads a
bounded amount, whatever the bytes are.
"""

from __future__ import annotations

__all__ = ["describe"]

Bytes = bytes | bytearray | memoryview

# how much of the start and of the end of a zip archive is searched for member names
_ZIP_WINDOW = 64 << 10
_TEXT_WINDOW = 512

_EXPORT_HINT = (
    "export the model with torch.export and ExecuTorch "
    "(to_edge_transform_and_lower(...).to_executorch()) and load the .pte that writes"
)

# the pickled magic number that starts a checkpoint in torch.save's legacy format
_LEGACY_TORCH_MAGIC = b"\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def describe(data: Bytes) -> str | None:
    """What ``data`` is and what to do with it, as a phrase (``"a PyTorch checkpoint ...;
    export ..."``), or None when nothing here recognises it."""
    try:
        view = memoryview(data).cast("B")
        return _describe(view)
    except Exception:  # a description is a courtesy: never a new way for a load to fail
        return None


def _describe(view: memoryview) -> str | None:
    size = len(view)
    if size == 0:
        return "the file is empty (0 bytes); write it again (did an export or a copy fail?)"
    head = bytes(view[:_TEXT_WINDOW])
    ident = head[4:8]
    if ident == b"ET12":
        return (
            "it is an ExecuTorch program (.pte); give it as the program, and its data file "
            "(.ptd) as the program's data"
        )
    if ident == b"FT01":
        return (
            "it is an ExecuTorch data file (.ptd), the external data of a program; load the "
            "program (.pte) and give this file as its data (data_path=, or --data)"
        )
    if ident == b"BP08":
        return (
            "it is a bundled program (.bpte): a program with test cases; read it with "
            "ptexec.format.bundled.read_bundled (program_bytes() is the program)"
        )
    if head[8:12] == b"ED00":
        return "it is an ETDump (a record of a run); read it with ptexec.etdump"
    if head.startswith(b"PK\x03\x04"):
        return _zip(view)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        if head[2 : 2 + len(_LEGACY_TORCH_MAGIC)] == _LEGACY_TORCH_MAGIC:
            return f"it is a PyTorch checkpoint (torch.save, legacy format); {_EXPORT_HINT}"
        return f"it is a Python pickle; {_EXPORT_HINT}"
    if head.startswith(b"\x1f\x8b"):
        return "it is gzip-compressed; decompress it first (gunzip)"
    if head.startswith(b"\x7fELF"):
        return "it is a compiled library or executable (ELF)"
    if head.startswith(b"\x93NUMPY"):
        return "it is a NumPy array (.npy)"
    return _text(head)


def _zip(view: memoryview) -> str:
    """A zip archive: a PyTorch checkpoint, a torch.export archive or TorchScript, told
    apart by the names of their members (each member's name is stored in its local header
    near the start, and all of them in the directory at the end)."""
    names = bytes(view[:_ZIP_WINDOW]) + bytes(view[-_ZIP_WINDOW:])
    if b"/archive_format" in names or b"serialized_exported_program" in names:
        return (
            "it is a torch.export archive (.pt2, torch.export.save): the model before "
            "ExecuTorch lowered it; lower it with to_edge_transform_and_lower(...)"
            ".to_executorch() and load the .pte that writes"
        )
    if b"/code/__torch__" in names or b"/constants.pkl" in names:
        return f"it is a TorchScript module (torch.jit.save, a zip archive); {_EXPORT_HINT}"
    if b"data.pkl" in names:
        return f"it is a PyTorch checkpoint (torch.save, a zip archive); {_EXPORT_HINT}"
    return "it is a zip archive"


def _text(head: bytes) -> str | None:
    """A text file (UTF-8, printable): a Git LFS pointer, a web page or other text."""
    for cut in range(4):  # the window may end inside a multi-byte character
        try:
            text = head[: len(head) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    if not text or not all(c.isprintable() or c in "\t\n\r\f" for c in text):
        return None
    if text.startswith("version https://git-lfs"):
        return (
            "it is a Git LFS pointer, not the file it stands for; fetch the file itself "
            "(git lfs pull, or download it again)"
        )
    lower = text.lstrip().lower()
    if lower.startswith(("<!doctype html", "<html")):
        return "it is a web page (HTML); the download saved a page rather than the file"
    if not text.strip():
        return "it is a text file of blank lines"
    first = text.strip().splitlines()[0]
    shown = first if len(first) <= 40 else first[:40] + "..."
    return f"it is a text file (it starts with {shown!r})"
