#!/usr/bin/env bash
# Installs what the MuJoCo validation videos need (bcg.validate.render), idempotently:
#   - an MP4 encoder: the ffmpeg on the PATH if there is one, else the static ffmpeg bundled by the
#     imageio-ffmpeg wheel (pip, no root needed);
#   - an offscreen OpenGL backend for MuJoCo: Mesa's EGL (software rendering works without a GPU),
#     or OSMesa, from apt when neither is present.
# Returns at once when both are already there. Never fails the CI run: without them the video test
# skips and says why.
set -u
PY=${PYTHON:-python}
have_ffmpeg() {
  command -v ffmpeg >/dev/null 2>&1 || "$PY" -c "import imageio_ffmpeg; imageio_ffmpeg.get_ffmpeg_exe()" >/dev/null 2>&1
}
gl_ok() {
  for backend in egl osmesa; do
    if MUJOCO_GL=$backend "$PY" -c "import mujoco; mujoco.Renderer(mujoco.MjModel.from_xml_string('<mujoco/>'), 8, 8).render()" >/dev/null 2>&1; then
      return 0
    fi
  done
  return 1
}
if ! have_ffmpeg; then
  "$PY" -m pip install -q imageio-ffmpeg >/dev/null 2>&1 || echo "install-render: pip install imageio-ffmpeg failed; the video test will skip" >&2
fi
if ! gl_ok; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
  fi
  if [ "$SUDO" = "none" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-render: no offscreen GL and no root/apt to install Mesa EGL; the video test will skip" >&2
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null 2>&1 || true
  $SUDO apt-get install -y -q --no-install-recommends libegl1 libgl1 libgl1-mesa-dri libosmesa6 >/dev/null 2>&1 \
    || echo "install-render: apt-get install of Mesa EGL/OSMesa failed; the video test will skip" >&2
fi
exit 0
