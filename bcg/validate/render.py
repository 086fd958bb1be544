"""Offscreen MP4 of an evaluation episode: the robot, the reference as a translucent ghost, a camera
that follows the pelvis.

Rendering uses MuJoCo's own renderer (:class:`mujoco.Renderer`) with an offscreen OpenGL context:
``MUJOCO_GL=egl`` (Mesa's software EGL works on a CPU-only machine) or ``MUJOCO_GL=osmesa``. MuJoCo
reads ``MUJOCO_GL`` when it is first imported, so command lines set it before importing anything
(see :mod:`bcg.validate.sim2sim`); this module sets a default of "egl" for programs that import it first.

Encoding uses an ``ffmpeg`` executable fed raw RGB frames through a pipe (H.264, yuv420p, so that
every player reads the file). None of the project's dependencies can write MP4; ``ffmpeg`` on the
PATH is used when present, otherwise the one bundled by the ``imageio-ffmpeg`` wheel (a static
build, installable with pip without root; ``.ci/install-render.sh`` installs it). The file is written
to a temporary name and renamed when complete.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import shutil  # noqa: E402
import subprocess  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from bcg.core import g1  # noqa: E402
from bcg.core.atomic import atomic_write  # noqa: E402

GHOST_RGBA = (0.3, 0.6, 1.0, 0.35)  # reference: translucent blue


class RenderError(Exception):
    """No offscreen GL context or no MP4 encoder, or the encoder failed; the message says which."""


@dataclass(frozen=True)
class VideoConfig:
    """Video settings.

    Attributes:
        width, height: pixels (even numbers, as H.264 with yuv420p requires).
        stride: control steps per frame; the frame rate ``fps`` keeps the video in real time
            (software rendering costs about half a second per frame here, hence the default of 2).
        distance: m, camera distance from the pelvis; elevation, azimuth: deg.
        ghost: draw the reference as a translucent copy of the robot.
    """

    width: int = 480
    height: int = 360
    stride: int = 2
    distance: float = 3.0
    elevation: float = -15.0
    azimuth: float = 120.0
    ghost: bool = True

    @property
    def fps(self) -> float:
        return 1.0 / (g1.CONTROL_DT * self.stride)


def find_ffmpeg() -> str:
    """Path of an ffmpeg executable: the PATH's, else imageio-ffmpeg's bundled one."""
    exe = shutil.which("ffmpeg")
    if exe:
        return exe
    try:  # optional (the video extra); its absence is reported below
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        raise RenderError(
            "no ffmpeg to encode MP4: install one (bash .ci/install-render.sh, or pip install imageio-ffmpeg)"
        ) from exc


def make_renderer(model: mujoco.MjModel, config: VideoConfig) -> mujoco.Renderer:
    """A MuJoCo offscreen renderer, or a RenderError that names the GL backend to install."""
    model.vis.headlight.ambient[:] = np.maximum(
        model.vis.headlight.ambient, 0.35
    )  # brighter than the default headlight
    model.vis.headlight.diffuse[:] = np.maximum(model.vis.headlight.diffuse, 0.6)
    model.vis.global_.offwidth = max(model.vis.global_.offwidth, config.width)
    model.vis.global_.offheight = max(model.vis.global_.offheight, config.height)
    try:
        return mujoco.Renderer(model, config.height, config.width)
    except Exception as exc:  # the GL backends raise several unrelated types
        raise RenderError(
            f"no offscreen OpenGL context (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}): {exc}; "
            "set MUJOCO_GL=egl or osmesa before Python starts and install Mesa's EGL or OSMesa "
            "(bash .ci/install-render.sh)"
        ) from exc


def render_frames(
    model: mujoco.MjModel, qpos: np.ndarray, ref_qpos: np.ndarray | None, config: VideoConfig = VideoConfig()
):
    """Yield RGB frames (height, width, 3) uint8, one per row of ``qpos`` (F, nq).

    ``ref_qpos`` (F, nq), if given and ``config.ghost``, is drawn as a translucent ghost.
    """
    qpos = np.asarray(qpos)
    if ref_qpos is not None and np.shape(ref_qpos) != qpos.shape:
        raise ValueError(f"ref_qpos must have the shape of qpos {qpos.shape}, got {np.shape(ref_qpos)}")
    renderer = make_renderer(model, config)
    data, ref_data = mujoco.MjData(model), mujoco.MjData(model)
    root = int(g1.body_ids(model, [g1.ROOT_BODY])[0])
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_FREE
    camera.distance, camera.elevation, camera.azimuth = config.distance, config.elevation, config.azimuth
    option = mujoco.MjvOption()
    perturb = mujoco.MjvPerturb()
    try:
        for f in range(len(qpos)):
            data.qpos[:] = qpos[f]
            mujoco.mj_kinematics(model, data)
            camera.lookat[:] = data.xpos[root]  # follow the pelvis
            renderer.update_scene(data, camera=camera, scene_option=option)
            if ref_qpos is not None and config.ghost:
                ref_data.qpos[:] = ref_qpos[f]
                mujoco.mj_kinematics(model, ref_data)
                scene = renderer.scene
                first = scene.ngeom
                mujoco.mjv_addGeoms(model, ref_data, option, perturb, mujoco.mjtCatBit.mjCAT_DYNAMIC, scene)
                for i in range(first, scene.ngeom):
                    scene.geoms[i].rgba[:] = GHOST_RGBA
            yield renderer.render()
    finally:
        renderer.close()


def write_mp4(path: str | Path, frames, config: VideoConfig = VideoConfig()) -> int:
    """Encode RGB frames (height, width, 3) uint8 into an H.264 MP4 atomically; returns the frame count."""
    path = Path(path)
    if config.width % 2 or config.height % 2:
        raise RenderError(f"video size must be even, got {config.width}x{config.height}")
    if not path.parent.is_dir():
        raise RenderError(f"{path}: folder {path.parent} does not exist")
    exe = find_ffmpeg()
    count = 0

    def encode(tmp: Path) -> None:
        nonlocal count
        cmd = [
            exe, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
            "-s", f"{config.width}x{config.height}", "-r", f"{config.fps:g}", "-i", "-",
            "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(tmp),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            for frame in frames:
                frame = np.ascontiguousarray(frame, dtype=np.uint8)
                if frame.shape != (config.height, config.width, 3):
                    raise RenderError(
                        f"frame {count} has shape {frame.shape}, "
                        f"expected ({config.height}, {config.width}, 3)"
                    )
                proc.stdin.write(frame.tobytes())
                count += 1
            proc.stdin.close()
            err = proc.stderr.read().decode(errors="replace")
            if proc.wait() != 0:
                raise RenderError(f"ffmpeg failed: {err.strip()}")
            if count == 0:
                raise RenderError("no frames to write")
        except BrokenPipeError as exc:
            proc.kill()
            raise RenderError(
                f"ffmpeg stopped reading frames: {proc.stderr.read().decode(errors='replace')}"
            ) from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    atomic_write(path, encode, suffix=".mp4")  # ffmpeg picks the container by the ending
    return count


def write_episode_video(
    path: str | Path,
    model: mujoco.MjModel,
    qpos: np.ndarray,
    ref_qpos: np.ndarray | None = None,
    config: VideoConfig = VideoConfig(),
) -> int:
    """Render an episode's configurations (F, nq), one per control step, with the reference as a ghost,
    to an MP4 of ceil(F / stride) frames; returns the frame count."""
    if config.stride < 1:
        raise RenderError(f"stride must be >= 1, got {config.stride}")
    qpos = np.asarray(qpos)[:: config.stride]
    ref_qpos = None if ref_qpos is None else np.asarray(ref_qpos)[:: config.stride]
    return write_mp4(path, render_frames(model, qpos, ref_qpos, config), config)
