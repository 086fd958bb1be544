"""Command line of :mod:`bcg.motion`.

    python -m bcg.motion import <clip.csv> --out motions/<name>.h5 --start F --end F [--fix-spikes]
    python -m bcg.motion check <file.h5>
    python -m bcg.motion info <file.h5>
    python -m bcg.motion select <clip.csv> --criterion {speed,flight,joint-speed} [--frames 450]

Exit status 0 on success, 2 with ``error: ...`` on stderr when an input is bad or a clip unusable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bcg.core import g1
from bcg.motion import check, importer, io, lafan, select, spikes
from bcg.motion.clip import MotionClip, resolve_path
from bcg.motion.errors import MotionFileError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bcg.motion", description="G1 motion clips: import LAFAN1 CSV windows, check, inspect."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="convert a window of a LAFAN1 G1 CSV into a clip file")
    imp.add_argument("csv", type=Path)
    imp.add_argument("--out", type=Path, required=True, help="the .h5 file to write")
    imp.add_argument("--start", type=int, default=0, help="first source frame kept (0-based)")
    imp.add_argument("--end", type=int, default=None, help="end of the kept range (exclusive)")
    imp.add_argument("--fix-spikes", action="store_true", help="repair single-frame joint spikes")
    imp.add_argument("--spike-threshold", type=float, default=spikes.DEFAULT_THRESHOLD, help="rad")
    chk = sub.add_parser("check", help="validate a clip file and report on its content")
    chk.add_argument("clip", help="a .h5 file, or a bare name in motions/")
    inf = sub.add_parser("info", help="print a summary of a clip file")
    inf.add_argument("clip", help="a .h5 file, or a bare name in motions/")
    sel = sub.add_parser("select", help="find the most dynamic window of a LAFAN1 G1 CSV")
    sel.add_argument("csv", type=Path)
    sel.add_argument("--criterion", choices=select.CRITERIA, required=True)
    sel.add_argument("--frames", type=int, default=450, help="window length in frames")
    return parser


def _import(args) -> int:
    began = time.perf_counter()
    result = importer.import_csv(
        args.csv,
        args.out,
        args.start,
        args.end,
        fix_spikes=args.fix_spikes,
        spike_threshold=args.spike_threshold,
    )
    for frame, joint in result.spikes:
        action = "fixed" if result.fixed else "found (use --fix-spikes to repair)"
        print(f"spike {action}: source frame {frame}, {g1.JOINT_NAMES[joint]}")
    size = result.path.stat().st_size / 1e6
    print(
        f"wrote {result.path}: {result.num_frames} frames, {len(result.spikes)} spikes "
        f"({'fixed' if result.fixed else 'not fixed'}), {size:.2f} MB in {time.perf_counter() - began:.1f} s"
    )
    return 0


def _check(args) -> int:
    model = g1.load_model(collisions="none", floor=False)
    clip = MotionClip.load(args.clip, model)
    report = check.check_clip(clip, model)
    print(f"{clip.path}: {clip.num_frames} frames, {clip.duration:.2f} s at {clip.fps:g} fps")
    print("\n".join(report.lines()))
    if not report.usable:
        failed = [topic for level, topic, _ in report.findings if level == "fail"]
        raise MotionFileError(f"{clip.path}: not usable ({', '.join(failed)} failed)")
    print("usable")
    return 0


def _info(args) -> int:
    path = resolve_path(args.clip)
    datasets, attrs = io.read_clip(path)
    t = len(datasets["joint_pos"])
    speed = np.linalg.norm(datasets["root_lin_vel_w"][:, :2], axis=1)
    lines = [
        f"file            {path} ({path.stat().st_size / 1e6:.2f} MB)",
        f"schema          version {attrs['schema_version']}, quaternions {attrs['quat_convention']}",
        f"frames          {t} at {attrs['fps']:g} fps = {(t - 1) / attrs['fps']:.3f} s",
        f"joints, bodies  {len(datasets['joint_names'])}, {len(datasets['body_names'])}",
        f"source          {attrs['source_file']} "
        f"frames [{attrs['source_frame_start']}, {attrs['source_frame_end']})",
        f"source sha256   {attrs['source_sha256']}",
        f"spikes fixed    {len(attrs['spikes_fixed'])} (threshold {attrs['spike_threshold']} rad)",
        f"root            height "
        f"{datasets['root_pos'][:, 2].min():.3f}-{datasets['root_pos'][:, 2].max():.3f} m, "
        f"horizontal speed mean {speed.mean():.2f} max {speed.max():.2f} m/s",
        f"content sha256  {io.content_hash(datasets, attrs['fps'])}",
        f"licence         {attrs['licence']}",
        f"attribution     {attrs['attribution']}",
    ]
    print("\n".join(lines))
    return 0


def _select(args) -> int:
    source = lafan.read_csv(args.csv)
    if not 3 <= args.frames <= len(source.joint_pos):
        raise MotionFileError(
            f"{args.csv}: --frames must be between 3 and the take's {len(source.joint_pos)} frames, "
            f"got {args.frames}"
        )
    model = g1.load_model(collisions="none", floor=False)
    datasets = importer.derive(model, source.root_pos, source.root_quat, source.joint_pos, lafan.FPS)
    try:
        window = select.best_window(datasets, args.criterion, args.frames, model, 1.0 / lafan.FPS)
    except ValueError as exc:
        raise MotionFileError(f"{args.csv}: {exc}") from exc
    print(
        f"{args.csv.name}: best window by {args.criterion}: frames [{window.start}, {window.end}) "
        f"({window.start / lafan.FPS:.2f}-{window.end / lafan.FPS:.2f} s), score {window.score:.3f}"
    )
    print(f"import with: --start {window.start} --end {window.end}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = {"import": _import, "check": _check, "info": _info, "select": _select}[args.command]
    try:
        return command(args)
    except MotionFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
