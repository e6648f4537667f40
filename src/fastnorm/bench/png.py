"""A tiny RGB raster canvas (rectangles and 5x7 text) and a PNG encoder: zlib + struct, no matplotlib."""
import struct
import zlib

from fastnorm.bench import font5x7


class Canvas:
    def __init__(self, width: int, height: int, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def fill_rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas."""
        x0, x1 = max(0, int(x0)), min(self.width, int(x1))
        y0, y1 = max(0, int(y0)), min(self.height, int(y1))
        if x0 >= x1 or y0 >= y1:
            return
        run = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start:start + len(run)] = run

    def pixel(self, x: int, y: int) -> tuple:
        i = (y * self.width + x) * 3
        return tuple(self.pixels[i:i + 3])

    @staticmethod
    def text_width(text: str, scale: int = 1) -> int:
        return len(text) * (font5x7.WIDTH + 1) * scale

    @staticmethod
    def text_height(scale: int = 1) -> int:
        return font5x7.HEIGHT * scale

    def draw_text(self, x: int, y: int, text: str, color, scale: int = 1) -> None:
        """Text with its top-left corner at (x, y); each font pixel is a scale x scale square."""
        for char in text:
            for row, bits in enumerate(font5x7.glyph(char)):
                for col in range(font5x7.WIDTH):
                    if bits & (1 << (font5x7.WIDTH - 1 - col)):
                        px, py = x + col * scale, y + row * scale
                        self.fill_rect(px, py, px + scale, py + scale, color)
            x += (font5x7.WIDTH + 1) * scale

    def to_png(self) -> bytes:
        return encode_png(self.width, self.height, bytes(self.pixels))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """8-bit RGB PNG of `rgb` (rows top to bottom, 3 bytes a pixel), no filtering."""
    stride = width * 3
    if len(rgb) != stride * height:
        raise ValueError("pixel buffer does not match width x height x 3")
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit depth, truecolor
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b""))
