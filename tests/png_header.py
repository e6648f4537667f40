"""Reads the size of a PNG from its header, without an image library."""
import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes):
    """(width, height) from the IHDR chunk, which must follow the signature with a valid CRC."""
    assert data[:8] == SIGNATURE, "not a PNG"
    (length,) = struct.unpack(">I", data[8:12])
    kind, body = data[12:16], data[16:16 + length]
    (crc,) = struct.unpack(">I", data[16 + length:20 + length])
    assert kind == b"IHDR" and length == 13 and crc == zlib.crc32(kind + body) & 0xFFFFFFFF
    width, height = struct.unpack(">II", body[:8])
    return width, height
