"""Tensors of the Open Inference Protocol over HTTP: JSON ``data`` and the binary tensor data extension.

Binary tensor data extension (https://github.com/triton-inference-server/server/blob/v2.67.0/docs/protocol/
extension_binary_data.md; KServe's reading of it: kserve/kserve@v0.20.0:python/kserve/kserve/protocol/infer_type.py
``InferRequest.from_bytes``, ``deserialize_bytes_tensor``):

- the body is the JSON request object followed by the tensors' bytes, in the order of the inputs; the header
  ``Inference-Header-Content-Length`` gives the length of the JSON part (``Content-Length`` stays the whole body);
- an input sent as binary says so with ``"parameters": {"binary_data_size": <bytes>}`` and has no ``data``;
- binary data is little-endian, row-major; a BYTES element is a 4-byte little-endian unsigned length followed by
  that many bytes;
- ``Inference-Header-Content-Length: 0`` is a "raw binary request": the whole body is the one input's data, and
  a BYTES input is then a single element without the length prefix (Triton adds it itself:
  triton-inference-server/core@73aad7c:src/infer_request.cc, ``PrependData(&raw_input_size_, sizeof(uint32_t))``);
- outputs: ``"parameters": {"binary_data": true}`` on a requested output, or ``"binary_data_output": true`` in the
  request's parameters for every output; the response then carries the same header, and each binary output has
  ``"parameters": {"binary_data_size": <bytes>}`` and no ``data``.

Every malformed body becomes a 400 :class:`~dinops.serve.errors.ApiError` naming what is wrong.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dinops.serve.errors import ApiError

HEADER = "Inference-Header-Content-Length"

NUMPY_TYPES = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4"}  # the datatypes this service answers with


def split_body(body: bytes, header: str | None) -> tuple[bytes | None, bytes]:
    """The body -> (its JSON part, or None for a raw binary request; the bytes after the JSON part)."""
    if header is None:
        return body, b""
    text = header.strip()
    if not text.isdigit():
        raise ApiError(400, "bad_header", f"{HEADER} must be a whole number of bytes, got {header!r}.")
    length = int(text)
    if length > len(body):
        raise ApiError(
            400,
            "bad_header",
            f"{HEADER} is {length} bytes but the whole body has only {len(body)}: the JSON part cannot be longer "
            "than the body.",
        )
    if length == 0:
        return None, body
    return body[:length], body[length:]


class BinaryReader:
    """Hands out the bytes after the JSON part to the inputs that declare ``binary_data_size``, in order."""

    def __init__(self, data: bytes, has_header: bool) -> None:
        self.data, self.offset, self.has_header = data, 0, has_header

    def take(self, size: Any, name: str) -> bytes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ApiError(
                400, "bad_input", f"input {name!r}: binary_data_size must be a whole number of bytes, got {size!r}."
            )
        if not self.has_header:
            raise ApiError(
                400,
                "bad_header",
                f"input {name!r} has binary_data_size but the request has no {HEADER} header saying where its JSON "
                "part ends.",
            )
        left = len(self.data) - self.offset
        if size > left:
            raise ApiError(
                400,
                "binary_size_mismatch",
                f"input {name!r} declares binary_data_size {size} but only {left} bytes follow the JSON part.",
            )
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def finish(self) -> None:
        extra = len(self.data) - self.offset
        if extra:
            raise ApiError(
                400,
                "binary_size_mismatch",
                f"{extra} bytes follow the JSON part beyond what the inputs' binary_data_size declare "
                f"({self.offset}): {HEADER} or a binary_data_size is wrong.",
            )


def bytes_elements(data: bytes, name: str) -> list[bytes]:
    """A BYTES tensor's binary data -> its elements (each a 4-byte little-endian length, then the bytes)."""
    elements, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise ApiError(
                400,
                "binary_size_mismatch",
                f"input {name!r}: element {len(elements)} starts with {len(data) - offset} bytes, too few for its "
                "4-byte length.",
            )
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise ApiError(
                400,
                "binary_size_mismatch",
                f"input {name!r}: element {len(elements)} says {length} bytes but only {len(data) - offset} are "
                "left in the input's binary data.",
            )
        elements.append(data[offset : offset + length])
        offset += length
    return elements


def flat(data: Any) -> list[Any]:
    """JSON tensor data, nested (one list per dimension) or already flat -> a flat row-major list (no recursion:
    the nesting is the client's to choose)."""
    items, stack = [], [iter([data])]
    while stack:
        item = next(stack[-1], stack)
        if item is stack:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            items.append(item)
    return items


@dataclass
class Output:
    name: str
    datatype: str
    array: np.ndarray


def encode_response(head: dict[str, Any], outputs: Sequence[tuple[Output, bool]]) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; ``outputs`` pairs each tensor with whether it goes as binary data."""
    described, blobs = [], []
    for output, binary in outputs:
        array = np.ascontiguousarray(output.array, dtype=NUMPY_TYPES[output.datatype])
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": list(array.shape)}
        if binary:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        described.append(entry)
    text = json.dumps({**head, "outputs": described}, separators=(",", ":")).encode()
    if not blobs:
        return text, {"Content-Type": "application/json"}
    return text + b"".join(blobs), {"Content-Type": "application/octet-stream", HEADER: str(len(text))}
