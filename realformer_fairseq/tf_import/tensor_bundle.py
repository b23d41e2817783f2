"""Read a TensorFlow checkpoint (the "V2" tensor bundle) without TensorFlow.

Google's BERT and RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) releases
ship TF1 checkpoints as a prefix ``PREFIX`` with two kinds of files (TensorFlow's
``tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc,proto}``):

* ``PREFIX.index``: an SSTable (LevelDB's table format, as TF's ``table::TableBuilder``
  writes it: uncompressed blocks, each followed by a type byte and a masked CRC32-C, then
  a 48-byte footer ending in the magic ``0xdb4775248b80fb57``). Its keys are the
  variable names in byte order; the key ``""`` holds a ``BundleHeaderProto`` (number of
  shards, endianness), every other key a ``BundleEntryProto`` (dtype, shape, shard,
  offset, size, masked CRC32-C of the bytes, slices of a partitioned variable).
* ``PREFIX.data-SSSSS-of-NNNNN``: the raw tensor bytes of each shard (little-endian, C order).

:func:`read_bundle` returns a :class:`TensorBundle`: the entries by name and
``bundle.tensor(name)`` (a numpy array, its CRC32-C checked). Every malformed input is a
:class:`TensorBundleError` (a ``ValueError``) whose one-line message names the file and,
where there is one, the variable.
"""

import dataclasses
import os
import struct
from typing import Dict, Iterator, List, Optional, Tuple

import google_crc32c
import numpy as np

from ..errors import RealformerConfigError

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # two block handles (varints) padded to 40 bytes, then the 8-byte magic
BLOCK_TRAILER_SIZE = 5  # 1 byte compression type + 4 bytes masked CRC32-C
NO_COMPRESSION = 0
_CRC_MASK_DELTA = 0xA282EAD8

# tensorflow/core/framework/types.proto DataType -> numpy dtype ("<" = little-endian)
DTYPES: Dict[int, np.dtype] = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    14: np.dtype("<u2"),  # DT_BFLOAT16: the upper half of a float32; see tensor()
    17: np.dtype("<u2"),  # DT_UINT16
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
DT_BFLOAT16 = 14
DTYPE_NAMES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
}


class TensorBundleError(RealformerConfigError):
    """A checkpoint file that cannot be read; the message is one line."""


def masked_crc32c(data: bytes) -> int:
    """LevelDB/TF's masked CRC32-C (``crc32c::Mask``), as stored in tables and bundle entries."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


# ------------------------------------------------------------------ protobuf wire format


def read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    """(value, position after it) of the base-128 varint at ``buf[pos]``."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise TensorBundleError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise TensorBundleError("varint longer than 64 bits")


def parse_proto(buf: bytes) -> Dict[int, List]:
    """Fields of a serialized protobuf message: field number -> list of raw values
    (ints for varint/fixed fields, bytes for length-delimited ones)."""
    fields: Dict[int, List] = {}
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = read_varint(buf, pos)
        elif wire_type == 1:
            (value,) = struct.unpack_from("<Q", buf, pos)
            pos += 8
        elif wire_type == 2:
            length, pos = read_varint(buf, pos)
            value = buf[pos : pos + length]
            if len(value) != length:
                raise TensorBundleError("truncated protobuf field")
            pos += length
        elif wire_type == 5:
            (value,) = struct.unpack_from("<I", buf, pos)
            pos += 4
        else:
            raise TensorBundleError(f"unsupported protobuf wire type {wire_type}")
        fields.setdefault(number, []).append(value)
    return fields


def _last(fields: Dict[int, List], number: int, default=0):
    values = fields.get(number)
    return values[-1] if values else default


# ------------------------------------------------------------------ SSTable


def _block_entries(block: bytes) -> Iterator[Tuple[bytes, bytes]]:
    """(key, value) pairs of one table block (prefix-compressed keys, restart array at
    the end)."""
    if len(block) < 4:
        raise TensorBundleError("table block shorter than its restart count")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * num_restarts
    if end < 0:
        raise TensorBundleError("table block restart array larger than the block")
    pos, key = 0, b""
    while pos < end:
        shared, pos = read_varint(block, pos)
        non_shared, pos = read_varint(block, pos)
        value_length, pos = read_varint(block, pos)
        if shared > len(key) or pos + non_shared + value_length > end:
            raise TensorBundleError("corrupt table block entry")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + value_length]
        pos += value_length


def _read_block(f, path: str, handle: bytes) -> bytes:
    offset, pos = read_varint(handle, 0)
    size, _ = read_varint(handle, pos)
    f.seek(offset)
    data = f.read(size + BLOCK_TRAILER_SIZE)
    if len(data) != size + BLOCK_TRAILER_SIZE:
        raise TensorBundleError(f"{path}: truncated (a table block runs past the end)")
    block, compression = data[:size], data[size]
    (stored_crc,) = struct.unpack_from("<I", data, size + 1)
    if masked_crc32c(data[: size + 1]) != stored_crc:
        raise TensorBundleError(f"{path}: checksum mismatch in a table block (corrupt file)")
    if compression != NO_COMPRESSION:
        raise TensorBundleError(
            f"{path}: table block compressed with type {compression}; TensorFlow's "
            "checkpoint writer does not compress, so this is not a tensor bundle index"
        )
    return block


def read_table(path: str) -> Iterator[Tuple[bytes, bytes]]:
    """Every (key, value) of the SSTable at ``path``, in key order."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        file_size = f.tell()
        if file_size < FOOTER_SIZE:
            raise TensorBundleError(f"{path}: too short for a TensorFlow checkpoint index")
        f.seek(file_size - FOOTER_SIZE)
        footer = f.read(FOOTER_SIZE)
        (magic,) = struct.unpack_from("<Q", footer, FOOTER_SIZE - 8)
        if magic != TABLE_MAGIC:
            raise TensorBundleError(
                f"{path}: not a TensorFlow checkpoint index (no table magic number; "
                "is it a V1 checkpoint or another file?)"
            )
        _, pos = read_varint(footer, 0)  # metaindex offset
        _, pos = read_varint(footer, pos)  # metaindex size (the meta block is empty)
        index_block = _read_block(f, path, footer[pos:])
        for _, handle in _block_entries(index_block):
            yield from _block_entries(_read_block(f, path, handle))


# ------------------------------------------------------------------ bundle


@dataclasses.dataclass(frozen=True)
class BundleEntry:
    """One variable of the bundle (``BundleEntryProto``)."""

    name: str
    dtype: int  # TF DataType enum value
    shape: Tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked
    num_slices: int

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"DataType {self.dtype}")


def _parse_shape(buf: bytes) -> Tuple[int, ...]:
    fields = parse_proto(buf)
    if _last(fields, 3):
        raise TensorBundleError("a tensor of unknown rank")
    return tuple(_last(parse_proto(dim), 1) for dim in fields.get(2, []))


def _parse_entry(name: str, buf: bytes) -> BundleEntry:
    fields = parse_proto(buf)
    return BundleEntry(
        name=name,
        dtype=_last(fields, 1),
        shape=_parse_shape(_last(fields, 2, b"")),
        shard_id=_last(fields, 3),
        offset=_last(fields, 4),
        size=_last(fields, 5),
        crc32c=_last(fields, 6),
        num_slices=len(fields.get(7, [])),
    )


class TensorBundle:
    """The variables of one checkpoint prefix; see :func:`read_bundle`."""

    def __init__(self, prefix: str, num_shards: int, entries: Dict[str, BundleEntry]):
        self.prefix = prefix
        self.num_shards = num_shards
        self.entries = entries

    def data_path(self, shard_id: int) -> str:
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> List[str]:
        return sorted(self.entries)

    def tensor(self, name: str) -> np.ndarray:
        """The variable ``name`` as a numpy array (bfloat16 widened exactly to float32),
        after checking its size and CRC32-C against the index."""
        if name not in self.entries:
            raise TensorBundleError(f"{self.prefix}: no variable {name}")
        entry = self.entries[name]
        if entry.num_slices:
            raise TensorBundleError(
                f"{self.prefix}: variable {name} is partitioned into {entry.num_slices} "
                "slices, which this reader does not join"
            )
        if entry.dtype not in DTYPES:
            raise TensorBundleError(
                f"{self.prefix}: variable {name} has dtype {entry.dtype_name}, "
                "which this reader does not read"
            )
        dtype = DTYPES[entry.dtype]
        count = int(np.prod(entry.shape, dtype=np.int64))
        if count * dtype.itemsize != entry.size:
            raise TensorBundleError(
                f"{self.prefix}: variable {name} has {entry.size} bytes, but shape "
                f"{list(entry.shape)} of {entry.dtype_name} needs {count * dtype.itemsize}"
            )
        path = self.data_path(entry.shard_id)
        if not os.path.exists(path):
            raise TensorBundleError(f"missing checkpoint data file {path}")
        with open(path, "rb") as f:
            f.seek(entry.offset)
            raw = f.read(entry.size)
        if len(raw) != entry.size:
            raise TensorBundleError(
                f"{path}: truncated (variable {name} needs bytes {entry.offset}.."
                f"{entry.offset + entry.size}); download the checkpoint again"
            )
        if masked_crc32c(raw) != entry.crc32c:
            raise TensorBundleError(
                f"{path}: checksum mismatch for variable {name} (corrupt file); "
                "download the checkpoint again"
            )
        array = np.frombuffer(raw, dtype=dtype).reshape(entry.shape)
        if entry.dtype == DT_BFLOAT16:
            array = (array.astype("<u4") << 16).view("<f4")
        return array.astype(array.dtype.newbyteorder("="), copy=True)


def checkpoint_index_path(prefix: str) -> str:
    return prefix + ".index"


def read_bundle(prefix: str) -> TensorBundle:
    """The tensor bundle ``PREFIX.index`` + ``PREFIX.data-*-of-*``.

    ``prefix`` is what TensorFlow calls the checkpoint path (``.../bert_model.ckpt``); a path
    ending in ``.index`` or ``.data-*`` is accepted too. Only the index is read here; tensors
    are read on demand by :meth:`TensorBundle.tensor`.
    """
    prefix = strip_checkpoint_suffix(prefix)
    index = checkpoint_index_path(prefix)
    if not os.path.exists(index):
        raise TensorBundleError(
            f"no TensorFlow checkpoint index {index} (give the checkpoint prefix, e.g. "
            ".../bert_model.ckpt for bert_model.ckpt.index + bert_model.ckpt.data-00000-of-00001)"
        )
    header: Optional[Dict[int, List]] = None
    entries: Dict[str, BundleEntry] = {}
    for key, value in read_table(index):
        if key == b"":
            header = parse_proto(value)
            continue
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            raise TensorBundleError(f"{index}: a variable name that is not UTF-8") from None
        entries[name] = _parse_entry(name, value)
    if header is None:
        raise TensorBundleError(f"{index}: no bundle header (not a V2 tensor bundle)")
    if _last(header, 2) != 0:
        raise TensorBundleError(
            f"{index}: a big-endian checkpoint, which this reader does not read"
        )
    num_shards = _last(header, 1, 1)
    bundle = TensorBundle(prefix, num_shards, entries)
    for entry in entries.values():
        if entry.shard_id >= num_shards:
            raise TensorBundleError(
                f"{index}: variable {entry.name} is in shard {entry.shard_id}, "
                f"but the header says {num_shards} shard(s)"
            )
    for shard_id in sorted({e.shard_id for e in entries.values() if e.size}):
        if not os.path.exists(bundle.data_path(shard_id)):
            raise TensorBundleError(f"missing checkpoint data file {bundle.data_path(shard_id)}")
    return bundle


def strip_checkpoint_suffix(path: str) -> str:
    """``x.ckpt`` for ``x.ckpt``, ``x.ckpt.index`` or ``x.ckpt.data-00000-of-00001``."""
    if path.endswith(".index"):
        return path[: -len(".index")]
    base, dot, tail = path.rpartition(".data-")
    if dot and "-of-" in tail:
        return base
    return path
