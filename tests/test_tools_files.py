"""Only regular files are read, with size caps: FIFOs and devices fail at once with one line, never hang."""
from __future__ import annotations

import os
import threading

import pytest

from iqa_tools import ImageError, ToolRegistry, load_image
from iqa_tools.errors import ToolTableError
from iqa_tools.files import MAX_TOOL_FILE_BYTES
from iqa_tools.table import load_table


def _no_hang(fn, seconds=5.0):
    """Run fn in a thread; fail (instead of hanging the suite) if it has not returned in `seconds`."""
    out: dict = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hung"
    return out.get("exc")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.png"
    os.mkfifo(path)
    return path


def test_fifo_as_image_reference_and_tool_file(fifo, tmp_path):
    exc = _no_hang(lambda: load_image(fifo))
    assert isinstance(exc, ImageError) and "FIFO" in str(exc) and "\n" not in str(exc)
    good = tmp_path / "ok.png"
    from PIL import Image

    Image.new("RGB", (64, 64), (90, 120, 30)).save(good)
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    exc = _no_hang(lambda: reg.score("PSNR", good, fifo))
    assert isinstance(exc, ImageError) and "pipe.png" in str(exc) and "FIFO" in str(exc)
    exc = _no_hang(lambda: load_table([fifo]))
    assert isinstance(exc, ToolTableError) and "FIFO" in str(exc)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_device_as_image_and_tool_file():
    exc = _no_hang(lambda: load_image("/dev/zero"))
    assert isinstance(exc, ImageError) and "/dev/zero: is a device, not a regular file" in str(exc)
    exc = _no_hang(lambda: load_table(["/dev/zero"]))
    assert isinstance(exc, ToolTableError) and "device" in str(exc)


def test_tool_file_size_cap(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_TOOL_FILE_BYTES + 1))
    with pytest.raises(ToolTableError, match="exceeds the 1,048,576-byte limit for a tool file"):
        load_table([big])
