"""Shrink a procgen wheel for one game: the background images that game never draws become 1-pixel PNGs.

procgen loads every asset folder when it starts, so the files must stay; their pixels need not. The full wheel
(48 MB) beside the project's tree is over what a device call carries (64 MiB); starpilot's slim one is 27 MB, and its
observations are the same to the last byte (checked: 300 random steps of 2 envs). procgen/SLIM_GAME names the game
(offline_study.sh refuses another); RECORD is rewritten to match.
    python scripts/slim_procgen_wheel.py WHEEL GAME     (GAME: starpilot, the study's default)
"""

import base64
import hashlib
import io
import sys
import zipfile

# The background folders each game draws from (procgen's src/games/*.cpp); the rest of a game's are never shown.
DRAWN = {"starpilot": {"space_backgrounds"}}
BACKGROUNDS = {"platform_backgrounds", "platform_backgrounds_2", "topdown_backgrounds", "water_backgrounds",
               "space_backgrounds"}
# A valid 1×1 black PNG.
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYGAAAAAEAAH2FzhVAAAAAElFTkSuQmCC")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(path: str, game: str) -> None:
    """Rewrite the wheel at PATH in place with GAME's undrawn backgrounds blanked."""
    blank = BACKGROUNDS - DRAWN[game]
    with zipfile.ZipFile(path) as src:
        items = [(info, src.read(info)) for info in src.infolist()]
    out = io.BytesIO()
    record = next(info for info, _ in items if info.filename.endswith(".dist-info/RECORD"))
    lines = []
    with zipfile.ZipFile(out, "w") as dst:

        def write(info: zipfile.ZipInfo, data: bytes) -> None:  # the entry's own attributes kept
            info.compress_type = zipfile.ZIP_STORED if info.is_dir() else zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
            if not info.is_dir() and info is not record:
                lines.append(_record_line(info.filename, data))

        for info, data in items:
            parts = info.filename.split("/")
            if parts[:3] == ["procgen", "data", "assets"] and len(parts) > 4 and parts[3] in blank:
                data = PIXEL
            if info is not record:
                write(info, data)
        slim_game = zipfile.ZipInfo("procgen/SLIM_GAME", date_time=record.date_time)
        slim_game.external_attr = 0o644 << 16
        write(slim_game, f"{game}\n".encode())
        lines.append(f"{record.filename},,")
        write(record, ("\n".join(lines) + "\n").encode())
    with open(path, "wb") as f:
        f.write(out.getvalue())


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in DRAWN:
        print(f"usage: slim_procgen_wheel.py WHEEL GAME (GAME one of {', '.join(DRAWN)})", file=sys.stderr)
        sys.exit(2)
    slim(sys.argv[1], sys.argv[2])
