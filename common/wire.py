"""The messages between the checks (trusted) and the worker (student code), over one socket.

- Requests, checks -> worker, are pickled: the worker may trust the checks. A CUDA tensor
  travels as a CUDA IPC handle (torch.multiprocessing's reduction), so the worker reads
  and writes device memory that the checks own, without a copy.
- Replies, worker -> checks, are never unpickled, since unpickling runs code. A reply is
  JSON for plain values plus the raw bytes of its tensors, and `decode_reply` rebuilds it
  with an allowlist of types and dtypes, checking every size, so whatever the worker sends
  becomes plain Python values and CPU tensors, or a `ProtocolError`.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import traceback

import torch

MAX_REQUEST_BYTES = 1 << 34  # the checks' own inputs (CPU tensors travel by value)
MAX_REPLY_BYTES = 1 << 30  # outputs of the checks' cases stay far below this
MAX_TEXT = 20_000  # characters of a message or traceback kept from the worker

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
    torch.uint8, torch.bool)}
_HEADER = struct.Struct("<Q")


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


class Kept:
    """Stands in a request for an object the worker keeps (`Worker.keep`), so it crosses once."""

    def __init__(self, name: str):
        self.name = name


# -- framing -------------------------------------------------------------------------------

def send_frame(sock, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)))
    sock.sendall(payload)


def recv_frame(sock, limit: int) -> bytes:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > limit:
        raise ProtocolError(f"a message of {size} bytes, more than the {limit} allowed")
    return _recv_exact(sock, size)


def _recv_exact(sock, size: int) -> bytes:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, 1 << 24))
        if n == 0:
            raise EOFError("the other side closed the connection")
        got += n
    return bytes(buf)


# -- requests (pickled; read by the worker only) ----------------------------------------------

class _RequestPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            return reduce_tensor(obj)  # an IPC handle: the worker maps the checks' memory
        return NotImplemented


def encode_request(request) -> bytes:
    buf = io.BytesIO()
    _RequestPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(request)
    return buf.getvalue()


def decode_request(payload: bytes):
    return pickle.loads(payload)


# -- replies (JSON and raw bytes; read by the checks) ---------------------------------------

def encode_reply(value) -> bytes:
    """JSON with tensors replaced by {"$tensor": i, ...}; the tensors' bytes follow in order."""
    blobs: list[bytes] = []

    def enc(v, depth=0):
        if depth > 20:
            raise TypeError("a reply nested more than 20 levels deep")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            blobs.append(data)
            return {"$tensor": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape), "device": v.device.type, "nbytes": len(data)}
        if isinstance(v, tuple):
            return {"$tuple": [enc(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return {"$list": [enc(x, depth + 1) for x in v]}
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {"$dict": {k: enc(x, depth + 1) for k, x in v.items()}}
        raise TypeError(f"a {type(v).__name__} cannot be sent back to the checks (only tensors, numbers, "
                        "strings, lists, tuples and dicts)")

    header = json.dumps(enc(value)).encode()
    return _HEADER.pack(len(header)) + header + b"".join(blobs)


def decode_reply(payload: bytes):
    """The reply as plain values and CPU tensors; ProtocolError for anything malformed."""
    try:
        (size,) = _HEADER.unpack_from(payload, 0)
        header = json.loads(payload[_HEADER.size:_HEADER.size + size])
    except (struct.error, ValueError, RecursionError) as err:
        raise ProtocolError(f"unreadable reply: {err}") from None
    offset = _HEADER.size + size
    tensors: list[tuple[int, int]] = []  # (start, nbytes) of each blob, in order

    def dec(v, depth=0):
        if depth > 25:
            raise ProtocolError("reply nested too deeply")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if not isinstance(v, dict) or len(v) == 0:
            raise ProtocolError(f"unexpected {type(v).__name__} in a reply")
        if "$tuple" in v and len(v) == 1 and isinstance(v["$tuple"], list):
            return tuple(dec(x, depth + 1) for x in v["$tuple"])
        if "$list" in v and len(v) == 1 and isinstance(v["$list"], list):
            return [dec(x, depth + 1) for x in v["$list"]]
        if "$dict" in v and len(v) == 1 and isinstance(v["$dict"], dict):
            return {str(k): dec(x, depth + 1) for k, x in v["$dict"].items()}
        if set(v) == {"$tensor", "dtype", "shape", "device", "nbytes"}:
            return _tensor(v)
        raise ProtocolError(f"unexpected keys {sorted(v)[:5]} in a reply")

    def _tensor(meta):
        nonlocal offset
        dtype = DTYPES.get(meta["dtype"]) if isinstance(meta["dtype"], str) else None
        shape = meta["shape"]
        if dtype is None:
            raise ProtocolError(f"a tensor of dtype {meta['dtype']!r}, which the checks do not accept")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40 for s in shape)):
            raise ProtocolError(f"a tensor with shape {shape!r}")
        if meta["$tensor"] != len(tensors) or meta["device"] not in ("cpu", "cuda"):
            raise ProtocolError("tensors out of order, or on an unknown device")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if meta["nbytes"] != nbytes or offset + nbytes > len(payload):
            raise ProtocolError(f"a tensor of shape {shape} and dtype {meta['dtype']} with {meta['nbytes']} bytes")
        tensors.append((offset, nbytes))
        data = bytearray(payload[offset:offset + nbytes])
        offset += nbytes
        t = torch.frombuffer(data, dtype=dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
        t.worker_device = meta["device"]  # where the worker's tensor was: its outputs must stay on its inputs' device
        return t

    value = dec(header)
    if offset != len(payload):
        raise ProtocolError(f"{len(payload) - offset} bytes left over after the reply")
    return value


def short_traceback(err: BaseException, frames: int) -> str:
    """The last `frames` frames of `err`'s traceback: enough to find the line, not a wall of text."""
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    return "".join(lines[-(frames + 1):-1]) if len(lines) > 1 else ""
