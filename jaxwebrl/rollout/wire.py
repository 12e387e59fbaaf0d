"""The transport's message format: a zmq multipart of one UTF-8 JSON header and raw little-endian array frames.

    frames = encode_message(header, payload)      # NumPy arrays anywhere in `payload` travel as frames
    header, payload = decode_message(frames)      # arrays come back with the same dtype and shape

Everything that is not an array must be plain JSON (str, int, float, bool, None, list, dict with str keys). No
pickle. What a peer sends is checked before anything is decoded or copied: a header that is a JSON object nested
at most MAX_JSON_DEPTH deep, at most MAX_ARRAYS arrays of allowed dtypes whose byte counts match their frames,
array markers that name an existing array; anything else is a `TransportError` naming the problem (never an
IndexError or a RecursionError). The server and client that carry these messages are `transport.py`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import zmq

PROTOCOL = "jaxwebrl-transport/2"
ARRAY_MARKER = "__ndarray__"
MAX_JSON_DEPTH = 64          # nesting of the JSON header (a chat request needs ~6)
MAX_ARRAYS = 1024            # arrays per message
MAX_ARRAY_DIMS = 32
_ALLOWED_KINDS = "biuf"  # bool, signed int, unsigned int, float
_WIRE_DTYPES = frozenset(np.dtype(t).newbyteorder("<").str for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))
_MAX_ECHOED_ID_CHARS = 64


class TransportError(RuntimeError):
    """The peer answered with an error, or the message was malformed."""


class TransportAuthError(TransportError, PermissionError):
    """The server refused the connection because the shared token did not match."""


class TransportTimeout(TransportError, TimeoutError):
    """No reply arrived within the timeout."""


class RequestRefused(ValueError):
    """Raised by a handler when the request itself is malformed: the client gets `TransportRequestRefused`."""


class TransportRequestRefused(TransportError):
    """The server refused the request as malformed (`RequestRefused`): sending it again cannot help."""


def _encode_value(value: Any, arrays: list[np.ndarray], path: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"{path}: array dtype {value.dtype} cannot travel; use bool, int, uint or float")
        arrays.append(value.astype(value.dtype.newbyteorder("<"), order="C", copy=False))
        return {ARRAY_MARKER: len(arrays) - 1}
    if isinstance(value, dict):
        out = {}
        for key, child in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: dict key {key!r} is not a str; JSON headers need str keys")
            if key == ARRAY_MARKER:
                raise ValueError(f"{path}: key {ARRAY_MARKER!r} is reserved by the transport")
            out[key] = _encode_value(child, arrays, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_encode_value(child, arrays, f"{path}[{i}]") for i, child in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(
        f"{path}: value of type {type(value).__name__} cannot travel; send JSON types or NumPy arrays"
    )


def _decode_value(value: Any, arrays: list[np.ndarray], depth: int = 0) -> Any:
    if depth > MAX_JSON_DEPTH:
        raise TransportError(f"message payload is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        if ARRAY_MARKER in value:
            index = value[ARRAY_MARKER]
            if len(value) != 1 or type(index) is not int or not 0 <= index < len(arrays):
                raise TransportError(f"bad array marker {short_text(value)}: expected {{{ARRAY_MARKER!r}: index}} with "
                                     f"0 <= index < {len(arrays)}")
            return arrays[index]
        return {key: _decode_value(child, arrays, depth + 1) for key, child in value.items()}
    if isinstance(value, list):
        return [_decode_value(child, arrays, depth + 1) for child in value]
    return value


def encode_message(header: dict, payload: dict) -> list[bytes | memoryview]:
    """Frames for ``payload`` (arrays become frames) under ``header`` (plain JSON fields)."""
    arrays: list[np.ndarray] = []
    body = _encode_value(payload, arrays, "payload")
    specs = [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]
    head = dict(header, protocol=PROTOCOL, payload=body, arrays=specs)
    return [json.dumps(head, separators=(",", ":")).encode()] + [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays]


def _buffer(frame) -> memoryview:
    """The bytes of a frame without copying them (zmq.Frame, bytes or memoryview)."""
    return frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)


def decode_message(frames: list) -> tuple[dict, dict]:
    """(header, payload) from frames (bytes or zmq.Frame); arrays are fresh writable NumPy arrays.

    Every check runs before any array is copied; each array is copied once. Raises TransportError naming the
    problem for anything malformed (never IndexError, RecursionError, ...)."""
    if not frames:
        raise TransportError("empty message")
    try:
        head = json.loads(bytes(_buffer(frames[0])))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, int too long, nested too deep
        raise TransportError(f"message header is not a JSON object: {short_text(exc)}") from None
    if not isinstance(head, dict) or head.get("protocol") != PROTOCOL:
        raise TransportError(f"message is not {PROTOCOL}: peer runs another version or another program")
    specs = head.get("arrays", [])
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise TransportError(f"header 'arrays' must be a list of at most {MAX_ARRAYS} array specs")
    if len(specs) != len(frames) - 1:
        raise TransportError(f"header names {len(specs)} arrays but {len(frames) - 1} frames arrived")
    views = []
    for index, (spec, frame) in enumerate(zip(specs, frames[1:])):
        dtype, shape = _checked_spec(spec, index)
        buffer = _buffer(frame)
        count = 1
        for dim in shape:
            count *= dim
        if buffer.nbytes != dtype.itemsize * count:
            raise TransportError(f"array frame {index} of {buffer.nbytes} bytes does not match {dtype} {shape}")
        views.append((buffer, dtype, shape))
    arrays = [np.frombuffer(buffer, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=True)
              for buffer, dtype, shape in views]
    payload = _decode_value(head.get("payload", {}), arrays)
    if not isinstance(payload, dict):
        raise TransportError(f"message payload must be a JSON object, got {type(payload).__name__}")
    return head, payload


def _checked_spec(spec: Any, index: int) -> tuple[np.dtype, tuple[int, ...]]:
    if (not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str) or spec["dtype"] not in _WIRE_DTYPES
            or not isinstance(spec.get("shape"), list)):
        raise TransportError(f"array spec {index} {short_text(spec)} is not {{'dtype': one of {sorted(_WIRE_DTYPES)}, "
                             "'shape': [int, ...]}")
    shape = spec["shape"]
    if len(shape) > MAX_ARRAY_DIMS or not all(type(d) is int and d >= 0 for d in shape):
        raise TransportError(f"array spec {index} has a bad shape {short_text(shape)}: at most {MAX_ARRAY_DIMS} "
                             "non-negative ints")
    return np.dtype(spec["dtype"]), tuple(shape)


def short_text(value: Any, limit: int = 120) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def echoable_id(request_id: Any) -> Any:
    """The request id to echo in a reply: an int or a short str, else None (never echo a peer's junk)."""
    if type(request_id) is int or (isinstance(request_id, str) and len(request_id) <= _MAX_ECHOED_ID_CHARS):
        return request_id
    return None


def error_reply(request_id: Any, kind: str, message: str) -> list:
    return encode_message({"id": request_id, "ok": False, "error_kind": kind, "error": message}, {})
