"""CRC of the Unitree low-level messages.

Unitree's CRC is a CRC-32 (polynomial 0x04C11DB7, register initialised to 0xFFFFFFFF, MSB first,
no reflection, no final XOR) over the message's C-struct image read as little-endian 32-bit words,
the last word (the crc field itself) left out. It equals CRC-32/MPEG-2 over each word's bytes in
big-endian order.

Computation: the CRC is affine in the message bits over GF(2). For a fixed message length n,
``crc(x) = crc(0) ^ XOR_p T[p, x_p]`` where ``T[p, v]`` is the register contribution of byte value
``v`` at byte position ``p`` (taken in the C image's own little-endian order). The tables
(n x 256 words; 1 MB for LowCmd_, 2 MB for LowState_) are built once per length with the usual
byte table pushed back through the message by numpy, after which one CRC is a single gather and
XOR-reduction: about 10 us for a LowCmd_, with no per-bit or per-byte Python loop.
"""

from __future__ import annotations

import functools

import numpy as np

from bcg.robot import dds_types as dt

POLYNOMIAL = 0x04C11DB7
INIT = 0xFFFFFFFF


def _byte_table() -> np.ndarray:
    """Standard MSB-first table: register after shifting byte v in from a zero register (256,)."""
    reg = np.arange(256, dtype=np.uint64) << np.uint64(24)
    for _ in range(8):
        top = (reg >> np.uint64(31)) & np.uint64(1)
        reg = ((reg << np.uint64(1)) & np.uint64(0xFFFFFFFF)) ^ (top * np.uint64(POLYNOMIAL))
    return reg.astype(np.uint32)


_TABLE = _byte_table()


def _advance_zero_byte(reg: np.ndarray) -> np.ndarray:
    """Register after shifting in one zero byte, elementwise for an array of registers."""
    return ((reg << np.uint32(8)) & np.uint32(0xFFFFFFFF)) ^ _TABLE[reg >> np.uint32(24)]


def _crc_stream_python(stream: bytes, reg: int = INIT) -> int:
    """Byte-table CRC of a (big-endian word) byte stream; only used to build constants."""
    for b in stream:
        reg = ((reg << 8) & 0xFFFFFFFF) ^ int(_TABLE[((reg >> 24) ^ b) & 0xFF])
    return reg


@functools.lru_cache(maxsize=4)
def _tables(nbytes: int) -> tuple[np.ndarray, int]:
    """Contribution tables T (nbytes, 256) in C-image byte order, and the CRC of nbytes zeros."""
    if nbytes % 4:
        raise ValueError(f"the CRC runs over whole 32-bit words; got {nbytes} bytes")
    stream_tables = np.empty((nbytes, 256), np.uint32)
    row = _TABLE.copy()  # a byte at the last stream position, register starting from zero
    for p in range(nbytes - 1, -1, -1):
        stream_tables[p] = row
        row = _advance_zero_byte(row)
    # C-image byte i (little-endian word i // 4) sits at stream position 4 (i // 4) + 3 - i % 4.
    image_pos = np.arange(nbytes)
    stream_pos = 4 * (image_pos // 4) + 3 - image_pos % 4
    zero_crc = _crc_stream_python(bytes(nbytes))
    return np.ascontiguousarray(stream_tables[stream_pos]), zero_crc


@functools.lru_cache(maxsize=8)
def _field_mask(layout: np.dtype) -> np.ndarray:
    """1 for the bytes of a C layout that belong to fields, 0 for padding (itemsize,) uint8."""
    mask = np.zeros(layout.itemsize, np.uint8)
    for offset, size in dt.layout_leaves(layout):
        mask[offset : offset + size] = 1
    return mask


def crc32_words(image: bytes | np.ndarray) -> int:
    """Unitree CRC of a C-struct image whose last 4 bytes are the crc field (left out).

    Args:
        image: the message's C-struct bytes (length a multiple of 4), e.g. 1004 for LowCmd_, or a
            0-d structured array of its layout; padding counts as zero (as in Unitree's memset
            structs) whatever the array holds there (numpy's copy() does not preserve padding).
    """
    if isinstance(image, bytes | bytearray):
        data = np.frombuffer(image, np.uint8)
    else:
        data = np.frombuffer(image.tobytes(), np.uint8)
        if image.dtype.names:
            data = data * _field_mask(image.dtype)
    body = data[:-4]
    tables, zero_crc = _tables(body.size)
    return int(np.bitwise_xor.reduce(tables[np.arange(body.size), body]) ^ np.uint32(zero_crc))


def low_cmd_crc(msg: dt.LowCmd_ | np.ndarray) -> int:
    """CRC of a LowCmd_ (message or :data:`dds_types.LOW_CMD_LAYOUT` image)."""
    image = msg if isinstance(msg, np.ndarray) else dt.low_cmd_layout(msg)
    return crc32_words(image)


def low_state_crc(msg: dt.LowState_ | np.ndarray) -> int:
    """CRC of a LowState_ (message or :data:`dds_types.LOW_STATE_LAYOUT` image)."""
    image = msg if isinstance(msg, np.ndarray) else dt.low_state_layout(msg)
    return crc32_words(image)
