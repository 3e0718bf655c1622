"""Video files from RGB frames (MP4 through PyAV's bundled ffmpeg, GIF through Pillow), the same videos in
TensorBoard events (as GIFs: no moviepy), and a caption drawn onto a frame with a tiny built-in font, so no screen,
system ffmpeg or font file is needed. (What a frame shows, the env's render or what the policy sees: `envs.views`.)"""

from __future__ import annotations

import gc
import io
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from parallel_ppo.core.files import new_folders, writing
from parallel_ppo.errors import ConfigError, WriteFailed
from parallel_ppo.runs.directory import check_writable

VIDEO_SUFFIXES = (".mp4", ".gif")
VIDEO_FPS = 15
"""Frames per second of eval videos (and of a demo's by default)."""
EVAL_VIDEO_TAG = "videos/eval"
"""TensorBoard tag of the video of each evaluation during training (`eval.video`)."""

_GLYPHS = {  # 3 × 5 pixels, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    " ": "000000000000000", "=": "000111000111000", "R": "110101110101101", "E": "111100111100111",
    "T": "111010010010010", "P": "111101111100100", "S": "111100111001111", ":": "000010000010000",
}


def stamp(frame: np.ndarray, text: str, scale: int = 4) -> np.ndarray:
    """`frame` with `text` (digits, `.-=: ` and `REPST`) in white on a black band at its top left."""
    out = frame.copy()
    glyphs = [_GLYPHS.get(ch.upper(), _GLYPHS[" "]) for ch in text]
    height, width = 7 * scale, (4 * len(glyphs) + 1) * scale
    out[:min(height, out.shape[0]), :min(width, out.shape[1])] = 0
    for k, bits in enumerate(glyphs):
        pixels = np.array([int(b) for b in bits], dtype=bool).reshape(5, 3)
        block = np.kron(pixels, np.ones((scale, scale), dtype=bool))
        top, left = scale, (4 * k + 1) * scale
        region = out[top:top + block.shape[0], left:left + block.shape[1]]
        region[block[:region.shape[0], :region.shape[1]]] = 255
    return out


def captioned(frames: list, most: int | None = None) -> Callable[[np.ndarray, float], bool]:
    """A frame sink (`core.evaluate.FrameSink`) that keeps each frame in `frames` with its episode return so far
    drawn on it, up to `most` frames (None: no limit); it says True once it has them all."""

    def keep(frame: np.ndarray, ret: float) -> bool:
        frames.append(stamp(frame, f"R {ret:g}"))
        return most is not None and len(frames) >= most

    return keep


def even_sides(frames: np.ndarray) -> np.ndarray:
    """Frames (..., H, W, 3) with a black row or column added where a side is odd: H.264's 4:2:0 colour needs even
    sides (a frame of a policy's images beside an env's render may have an odd one)."""
    h, w = frames.shape[-3:-1]
    pad = [(0, 0)] * (frames.ndim - 3) + [(0, h % 2), (0, w % 2), (0, 0)]
    return np.pad(frames, pad) if h % 2 or w % 2 else frames


def check_video_path(path: Path) -> None:
    """Refuse an unsupported suffix or an unwritable place before anything runs."""
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise ConfigError(f"video file {path} must end in .mp4 or .gif")
    if path.is_dir():
        raise ConfigError(f"video file {path} is a directory")
    check_writable(path.parent if str(path.parent) else Path("."), f"video file {path}")


def write_video(path: Path, frames: Sequence[np.ndarray], fps: int) -> None:
    """Write `frames` (H, W, 3 uint8) to `path` (.mp4 or .gif), through a temporary file and a rename; WriteFailed
    naming it where it cannot be (a full disk: PyAV says so as an EOFError), the folders made for it removed."""
    import imageio.v3 as iio

    if not frames:
        raise ConfigError(f"no frames to write to {path}")
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")
    stack = np.stack(frames)
    try:
        with writing(path, (OSError, EOFError)), new_folders(path.parent):
            try:
                if path.suffix.lower() == ".mp4":
                    iio.imwrite(tmp, even_sides(stack), plugin="pyav", codec="libx264", fps=fps)
                else:
                    iio.imwrite(tmp, stack, duration=1000 / fps, loop=0)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
    except WriteFailed as failed:
        collect_quietly(failed)  # its cause's frames hold the failed writer
        raise


def collect_quietly(error: BaseException | None) -> None:
    """Free the frames of a failed encoder's tracebacks (`error`'s and those it chains) now, its writer's second
    failure of the kind (OSError, EOFError) as it is collected (imageio closes it again) unprinted: the error was
    said once. Errors of other kinds raised as objects are collected meanwhile are printed as ever (one of those
    kinds, from another object collected in that moment, would not be)."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda raised: None if isinstance(raised.exc_value, (OSError, EOFError)) else hook(raised)
    try:
        chained, seen = [error], set()
        while chained:
            if (one := chained.pop()) is not None and id(one) not in seen:  # a chain may loop
                seen.add(id(one))
                one.__traceback__ = None
                chained += [one.__cause__, one.__context__]
        gc.collect()
    finally:
        sys.unraisablehook = hook


TENSORBOARD_MAX_SIDE = 256
"""Frames larger than this are shrunk (by a whole factor) for TensorBoard, whose event files hold the GIF itself."""


def gif_bytes(frames: Sequence[np.ndarray], fps: int) -> bytes:
    """`frames` (H, W, 3 uint8) as an animated GIF that loops, encoded in memory by Pillow with a fast octree palette
    per frame and no dithering (300 starpilot frames of 256² pixels: 0.8 s and 3.3 MB, against 15 s and 14 MB with
    Pillow's default median cut)."""
    from PIL import Image

    images = [Image.fromarray(f).quantize(256, Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE) for f in frames]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return out.getvalue()


def purge_tensorboard(log_dir: Path, step: int) -> None:
    """Have TensorBoard drop the events `log_dir` holds from `step` on (a resumed run's, logged after its checkpoint):
    an event file of its own, read after theirs."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(log_dir), purge_step=step)
    writer._get_file_writer()  # writes the purge
    writer.close()


def add_tensorboard_video(log_dir: Path, tag: str, frames: Sequence[np.ndarray], fps: int, step: int) -> None:
    """Add `frames` to the TensorBoard events in `log_dir` as an animated GIF (shown under Images), at `step`.

    torch's `SummaryWriter.add_video` needs moviepy (and its 1.x `moviepy.editor`), and without it writes nothing
    but a printed line; this writes the same image summary from a GIF encoded by Pillow."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    if not frames:
        raise ConfigError(f"no frames to add to TensorBoard as {tag}")
    shrink = max(1, -(-max(frames[0].shape[:2]) // TENSORBOARD_MAX_SIDE))
    small = [np.ascontiguousarray(f[::shrink, ::shrink]) for f in frames]
    height, width = small[0].shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif_bytes(small, fps))
    writer = SummaryWriter(str(log_dir))
    try:
        writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    finally:
        writer.close()
