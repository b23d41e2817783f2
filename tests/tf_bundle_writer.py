"""A small writer of TensorFlow "V2" checkpoints (tensor bundles), for tests only.

It writes what TensorFlow's ``BundleWriter`` writes (tensorflow/core/util/tensor_bundle):
``PREFIX.data-SSSSS-of-NNNNN`` (raw little-endian bytes) and ``PREFIX.index`` (an
uncompressed LevelDB-format table whose keys are the variable names in byte order, ``""``
first holding the ``BundleHeaderProto``, values ``BundleEntryProto`` with the masked
CRC32-C of each tensor). It is written from the format, not from the plugin's reader, and
the tests check its output with the generator's independent reader
(``../shared/data/realformer_tf/generator/reference_forward.py``).

Options make files TensorFlow also writes but the fixture does not exercise: several
shards, several data blocks with prefix-compressed keys, optimizer slots and
``global_step``.
"""

import struct
from typing import Dict, List, Mapping, Optional, Tuple

import google_crc32c
import numpy as np

_DT_OF = {
    np.dtype("float32"): 1,
    np.dtype("float64"): 2,
    np.dtype("int32"): 3,
    np.dtype("int64"): 9,
    np.dtype("float16"): 19,
}
DT_BFLOAT16 = 14
MAGIC = 0xDB4775248B80FB57


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _field_fixed32(number: int, value: int) -> bytes:
    return _varint((number << 3) | 5) + struct.pack("<I", value)


def _shape_proto(shape: Tuple[int, ...]) -> bytes:
    return b"".join(_field_bytes(2, _field_varint(1, d) if d else b"") for d in shape)


def _block(entries: List[Tuple[bytes, bytes]], restart_interval: int) -> bytes:
    out, restarts, previous = bytearray(), [], b""
    for i, (key, value) in enumerate(entries):
        if i % restart_interval == 0:
            restarts.append(len(out))
            shared = 0
        else:
            shared = 0
            while shared < min(len(key), len(previous)) and key[shared] == previous[shared]:
                shared += 1
        out += _varint(shared) + _varint(len(key) - shared) + _varint(len(value))
        out += key[shared:] + value
        previous = key
    restarts = restarts or [0]
    out += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(out)


def _write_block(f, block: bytes) -> bytes:
    """Write ``block`` + trailer; return its handle (varint offset, varint size)."""
    offset = f.tell()
    trailer_type = b"\x00"
    crc = _mask(google_crc32c.value(block + trailer_type))
    f.write(block + trailer_type + struct.pack("<I", crc))
    return _varint(offset) + _varint(len(block))


def write_bundle(
    prefix: str,
    tensors: Mapping[str, np.ndarray],
    num_shards: int = 1,
    block_size: int = 4096,
    restart_interval: int = 16,
    bfloat16: Optional[set] = None,
):
    """Write ``tensors`` (name -> array) as ``prefix.index`` + ``prefix.data-*``; variables
    go round-robin to ``num_shards`` shards; names in ``bfloat16`` are stored as bfloat16
    (their float32 values truncated)."""
    bfloat16 = bfloat16 or set()
    shards = [open(f"{prefix}.data-{s:05d}-of-{num_shards:05d}", "wb") for s in range(num_shards)]
    entries: Dict[bytes, bytes] = {}
    try:
        for i, name in enumerate(sorted(tensors)):
            array = np.asarray(tensors[name])  # (ascontiguousarray would make a scalar 1-d)
            if name in bfloat16:
                dtype = DT_BFLOAT16
                raw = (array.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
            else:
                dtype = _DT_OF[array.dtype]
                raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
            shard = i % num_shards
            f = shards[shard]
            offset = f.tell()
            f.write(raw)
            entries[name.encode()] = (
                _field_varint(1, dtype)
                + _field_bytes(2, _shape_proto(array.shape))
                + _field_varint(3, shard)
                + _field_varint(4, offset)
                + _field_varint(5, len(raw))
                + _field_fixed32(6, _mask(google_crc32c.value(raw)))
            )
    finally:
        for f in shards:
            f.close()
    header = _field_varint(1, num_shards) + _field_bytes(3, _field_varint(1, 1))
    items = [(b"", header)] + sorted(entries.items())
    with open(prefix + ".index", "wb") as f:
        index_entries, current, current_size = [], [], 0
        for key, value in items:
            current.append((key, value))
            current_size += len(key) + len(value)
            if current_size >= block_size:
                index_entries.append(
                    (current[-1][0], _write_block(f, _block(current, restart_interval)))
                )
                current, current_size = [], 0
        if current:
            index_entries.append(
                (current[-1][0], _write_block(f, _block(current, restart_interval)))
            )
        meta_handle = _write_block(f, _block([], 1))
        index_handle = _write_block(f, _block(index_entries, 1))
        footer = meta_handle + index_handle
        f.write(footer + b"\x00" * (40 - len(footer)) + struct.pack("<Q", MAGIC))
