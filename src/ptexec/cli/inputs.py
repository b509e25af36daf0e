"""The inputs of a command that calls a method: files (.pt, .npy) or random values."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import device_map_of, load_program, one_line


def random_input(info: Any, generator: Any) -> Any:
    import torch

    from ..loader import ScalarInfo

    if isinstance(info, ScalarInfo):
        return info.value
    dtype = info.dtype
    sizes = info.sizes
    device = info.device.to_torch()
    if dtype == torch.bool:
        x = torch.randint(0, 2, sizes, generator=generator).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(sizes, generator=generator).to(dtype)
    else:
        x = torch.randint(0, 8, sizes, generator=generator).to(dtype)
    return laid_out(x, info).to(device)


def laid_out(x: Any, info: Any) -> Any:
    """``x`` in the layout the program reads its input ``info`` in, where the binding
    would not take it in place (a copy; else ``x`` itself). A file holds an array, not a
    layout (numpy writes C or Fortran order, never channels last): the command's own
    tensors are laid out as the program reads them, never refused for their layout.
    Tensors the binding refuses for another reason (dtype, rank, a sparse layout, a
    device it does not model) are left for it to refuse."""
    import torch

    from ..binding import fits_layout
    from ..loader import ScalarInfo
    from ..tensor import describe, dim_order_strides

    if (
        isinstance(info, ScalarInfo)
        or not isinstance(x, torch.Tensor)
        or x.is_nested
        or x.layout != torch.strided
        or x.device.type not in ("cpu", "cuda")
        or info.dim_order is None
        or x.dim() != len(info.sizes)
        or fits_layout(info, describe(x))
    ):
        return x
    strides = dim_order_strides(x.shape, info.dim_order)
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)


def read_inputs(paths: Sequence[str]) -> list[Any]:
    """The inputs in ``--input`` files: an array numpy.save wrote (known by its content,
    whatever the name), or a tensor, number or list of them saved with ``torch.save``.
    Read without running anything from the file (numpy without pickles, torch with
    ``weights_only``); a file that does not hold that is an
    :class:`~ptexec.errors.InputError` saying what it holds."""
    import torch

    inputs: list[Any] = []
    for path in paths:
        with open(path, "rb") as f:  # a missing file, a directory: the OS's error
            head = f.read(4096)
        if not head:
            raise _input_error(path, "the file is empty (0 bytes)")
        # the content decides (numpy.save's under any name, torch.save's under .npy too);
        # the name only where the content is neither's
        if _is_npy(head) or (Path(path).suffix.lower() == ".npy" and not _torch_like(head)):
            inputs.append(_read_npy(path))
            continue
        try:
            with warnings.catch_warnings():  # the refusal below says what is wrong
                warnings.simplefilter("ignore")
                data = torch.load(path, weights_only=True)
        except Exception as e:  # whatever torch makes of hostile bytes: a refusal
            raise _input_error(path, _unreadable(e, path, head)) from e
        items = list(data) if isinstance(data, list | tuple) else [data]
        for item in items:
            if not (item is None or isinstance(item, torch.Tensor | bool | int | float)):
                kind = "a list holding " if item is not data else ""
                raise _input_error(
                    path,
                    f"it holds {kind}a {type(item).__name__}; expected a tensor, a number "
                    "(or None), or a list or tuple of them",
                )
        inputs.extend(items)
    return inputs


def _is_npy(head: bytes) -> bool:
    try:
        from numpy.lib.format import MAGIC_PREFIX
    except ImportError:  # without numpy, torch.load's refusal says what the file is
        return False
    return head.startswith(MAGIC_PREFIX)


def _torch_like(head: bytes) -> bool:
    """Whether a file starting with ``head`` may be torch.save's: a zip archive, or (its
    legacy format) a pickle of protocol 2 or later."""
    return head.startswith((b"PK\x03\x04", b"\x80"))


def _read_npy(path: str) -> Any:
    import numpy as np
    import torch

    try:
        array = np.load(path, allow_pickle=False)
        if not isinstance(array, np.ndarray):
            raise ValueError(f"it holds a {type(array).__name__}, not one array")
        if not array.dtype.isnative:  # saved on (or for) a machine of the other byte order
            array = array.astype(array.dtype.newbyteorder("="))
        return torch.from_numpy(array)
    except Exception as e:
        raise _input_error(path, f"not an array numpy reads safely: {one_line(str(e))}") from e


def _input_error(path: str, message: str) -> Exception:
    from ..errors import InputError

    return InputError(
        f"input file {path}: {message} (save inputs with torch.save(tensor or list) or numpy.save)"
    )


def _unreadable(e: Exception, path: str, head: bytes) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a phrase."""
    import mmap
    import pickle

    import torch

    from ..format.identify import describe

    try:  # the whole file, for what a zip archive holds
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            what = describe(memoryview(m))
    except (OSError, ValueError, BufferError):  # not a file that maps (a pipe, a device)
        what = describe(head)
    what = what.split(";")[0] if what is not None else None
    torch_like = _torch_like(head)
    text = str(e)
    if what is not None and not torch_like:
        return f"not a file torch.save wrote: {what}"
    if not torch_like:  # torch.save writes a zip archive, or (legacy) a pickle from protocol 2
        return (
            "neither torch.save nor numpy.save wrote it (raw bytes have no dtype or shape: "
            "numpy.fromfile reads them as an array given its dtype)"
        )
    if isinstance(e, pickle.UnpicklingError) and text.startswith("Weights only load failed"):
        # torch's first paragraph is advice to load unsafely, its last a link; between them
        # is what it refused
        body = text.partition("\n")[2].split("Check the documentation")[0]
        detail = one_line(body.rpartition("WeightsUnpickler error:")[2]).rstrip(".")
        return (
            "it holds Python objects other than tensors, which loading without running "
            f"code refuses ({detail or 'no detail'})"
        )
    if "CUDA device" in text and not torch.cuda.is_available():
        return "it holds CUDA tensors, and torch has no CUDA device here"
    if what is not None and not what.startswith(("it is a PyTorch", "it is a Python pickle")):
        return f"not a file torch.save wrote: {what}"
    return f"torch.load cannot read it ({type(e).__name__}: {one_line(text) or 'no detail'})"


def summary(x: Any) -> str:
    import torch

    if not isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {x!r}"
    dtype = str(x.dtype).removeprefix("torch.")
    if x.is_nested:  # (it has no one shape)
        return f"{dtype} nested tensor on {x.device}"
    dims = ", ".join(str(s) for s in x.shape)
    text = f"{dtype}[{dims}] on {x.device}"
    if x.layout != torch.strided:
        return f"{text}, {str(x.layout).removeprefix('torch.')} layout"
    # values only of what a method may take: a tensor it refuses is described, not read
    # (a quantized or meta tensor has none to read), and its refusal is the error
    if x.numel() and not x.is_quantized and x.device.type in ("cpu", "cuda"):
        if not (x.is_floating_point() or x.is_complex() or x.dtype == torch.uint64):
            # integers exactly (through float64 they were rounded, past 2**53 changed)
            t = x.detach()
            if t.dtype in (torch.uint16, torch.uint32):
                t = t.long()  # (torch has no min of these; int64 holds them)
            low, high = int(t.min().item()), int(t.max().item())
            return text + f"  min {low}  max {high}  mean {t.double().mean().item():.4g}"
        f = x.detach().double() if not x.is_complex() else x.detach().abs().double()
        finite = f[f.isfinite()]
        if finite.numel():
            text += (
                f"  min {finite.min().item():.4g}  max {finite.max().item():.4g}"
                f"  mean {finite.mean().item():.4g}"
            )
        bad = f.numel() - finite.numel()
        if bad:
            text += f"  ({bad} not finite)"
    return text


def method_and_inputs(args: argparse.Namespace, **options: Any) -> tuple[Any, list[Any]]:
    """Load the method ``args`` names and make its inputs (``--input`` files, or random
    ones from its metadata and ``--seed``); print what they are."""
    import torch

    prog = load_program(args)
    name = args.method or ("forward" if "forward" in prog.method_names else prog.method_names[0])
    if args.device_map:
        options["device_map"] = device_map_of(args)
    method = prog.load_method(name, **options)
    if args.input:
        inputs = read_inputs(args.input)
        inputs[: len(method.meta.inputs)] = [
            laid_out(x, info) for x, info in zip(inputs, method.meta.inputs, strict=False)
        ]
    else:
        from ..llm.decoder import example_inputs

        gen = torch.Generator().manual_seed(args.seed)
        llm_inputs = example_inputs(prog, method.meta, gen)
        if llm_inputs is not None:  # random positions would run past the KV cache
            inputs = llm_inputs
            print(
                f"method '{name}' of an LLM: random tokens at positions from 0 (for text: "
                f"ptexec generate {args.file} --tokenizer tokenizer.json --prompt ...)"
            )
        else:
            inputs = [random_input(info, gen) for info in method.meta.inputs]
            print(f"method '{name}': {len(inputs)} random input(s) from the method's metadata")
    for i, x in enumerate(inputs):
        print(f"  input {i}: {summary(x)}")
    return method, inputs
