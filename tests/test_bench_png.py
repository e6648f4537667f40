"""The PNG writer and the chart drawn with it (no matplotlib)."""
import struct
import zlib

from bench_fakes import fake_row

from fastnorm.bench import chart
from fastnorm.bench.cases import BenchCase
from fastnorm.bench.png import Canvas, encode_png
from fastnorm.bench.runner import RowResult


def read_png(data: bytes):
    """(width, height, rgb bytes) of an 8-bit RGB, unfiltered PNG; checks signature and CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color) == (8, 2)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 3 * width + 1
    assert len(raw) == stride * height
    assert all(raw[y * stride] == 0 for y in range(height))
    rgb = b"".join(raw[y * stride + 1:(y + 1) * stride] for y in range(height))
    return width, height, rgb


def test_png_round_trips_pixels():
    canvas = Canvas(7, 3)
    canvas.fill_rect(2, 1, 4, 3, (10, 20, 30))
    width, height, rgb = read_png(canvas.to_png())
    assert (width, height) == (7, 3)
    px = lambda x, y: tuple(rgb[(y * width + x) * 3:(y * width + x) * 3 + 3])
    assert px(2, 1) == px(3, 2) == (10, 20, 30)
    assert px(1, 1) == px(4, 1) == px(2, 0) == (255, 255, 255)


def test_fill_rect_clips_to_the_canvas():
    canvas = Canvas(4, 4)
    canvas.fill_rect(-5, -5, 100, 2, (0, 0, 0))
    assert canvas.pixel(3, 1) == (0, 0, 0) and canvas.pixel(0, 2) == (255, 255, 255)


def test_text_draws_glyph_pixels_at_scale():
    canvas = Canvas(40, 20)
    canvas.draw_text(0, 0, "1", (0, 0, 0), scale=2)
    # "1" has its stem in column 2 on every row: at scale 2, pixels (4..5, 0..13).
    assert canvas.pixel(4, 0) == canvas.pixel(5, 13) == (0, 0, 0)
    assert canvas.pixel(2, 13) == (0, 0, 0)  # the foot spans columns 1..3 -> x 2..7
    assert canvas.pixel(0, 13) == canvas.pixel(4, 14) == (255, 255, 255)
    assert Canvas.text_width("abc", 2) == 36


def test_encode_rejects_a_wrong_buffer_size():
    try:
        encode_png(2, 2, b"\x00" * 11)
    except ValueError:
        return
    raise AssertionError("expected ValueError")


def test_chart_draws_bars_in_each_implementation_color(tmp_path):
    case = BenchCase("lastdim", "layer_norm", "fp32", (64, 4096), (1,), affine=True)
    rows = [fake_row(case, {"fastnorm": 0.01, "eager": 0.02, "compile": 0.04}),
            fake_row(case, {}, status="failed"),
            RowResult(case, "skipped", note="too big")]
    path = tmp_path / "sub" / "chart.png"
    chart.write_chart(rows, path, "TITLE", "subtitle")
    width, height, rgb = read_png(path.read_bytes())
    assert width > 700 and height > 150
    colors = {rgb[i:i + 3] for i in range(0, len(rgb), 3)}
    for name in ("fastnorm", "eager", "compile"):
        assert bytes(chart.COLORS[name]) in colors
    assert bytes(chart.RED) in colors  # the FAILED / SKIPPED words


def test_bar_length_is_proportional_to_percent_of_copy():
    case = BenchCase("lastdim", "rms_norm", "fp32", (64, 4096), (1,), affine=True)
    copy_bw = case.minimal_bytes() / 1e-3 / 0.8  # fastnorm at 80% of copy, eager 40%, compile 20%
    row = fake_row(case, {"fastnorm": 1.0, "eager": 2.0, "compile": 4.0}, copy_bw=copy_bw)
    canvas = chart.render_chart([row], "T")
    lengths = {}
    for name in ("fastnorm", "eager", "compile"):
        color = tuple(chart.COLORS[name])  # longest run of the color on one line: the bar, not the legend
        lengths[name] = max(sum(canvas.pixel(x, y) == color for x in range(canvas.width))
                            for y in range(canvas.height))
    assert abs(lengths["fastnorm"] - 0.8 * chart.PLOT_WIDTH) <= 1
    assert abs(lengths["fastnorm"] - 2 * lengths["eager"]) <= 2
    assert abs(lengths["eager"] - 2 * lengths["compile"]) <= 2


def test_axis_grows_past_100_percent_but_is_capped():
    case = BenchCase("latency", "rms_norm", "bf16", (1, 4096), (1,), affine=True)
    small = fake_row(case, {"fastnorm": 1.0})
    fast = fake_row(case, {"fastnorm": case.minimal_bytes() / 1.3e12 * 1e3}, copy_bw=1e12)  # 130%
    huge = fake_row(case, {"fastnorm": case.minimal_bytes() / 9e12 * 1e3}, copy_bw=1e12)
    assert chart.axis_max([small]) == 100
    assert chart.axis_max([fast]) == 150
    assert chart.axis_max([huge]) == chart.MAX_AXIS


def test_chart_leaves_out_an_implementation_no_row_timed():
    case = BenchCase("lastdim", "rms_norm", "fp32", (64, 4096), (1,), affine=True)
    with_compile = chart.render_chart([fake_row(case, {"fastnorm": 1.0, "eager": 2.0, "compile": 3.0})], "T")
    without = chart.render_chart([fake_row(case, {"fastnorm": 1.0, "eager": 2.0})], "T")
    orange = bytes(chart.COLORS["compile"])
    assert orange in bytes(with_compile.pixels) and orange not in bytes(without.pixels)
    assert without.height < with_compile.height
