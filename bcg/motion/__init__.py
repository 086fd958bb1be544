"""Motion clips of the G1 in HDF5: import from LAFAN1 CSV, validate, load and sample.

The file format is documented in :mod:`bcg.motion.schema`; the loading API is :class:`MotionClip`.
Command line: ``python -m bcg.motion {import,check,info,select} ...`` (see ``--help``).
"""

from bcg.motion.clip import KEY_BODY_NAMES, MOTIONS_DIR, MotionClip, MotionState
from bcg.motion.errors import MotionFileError
from bcg.motion.schema import SCHEMA_VERSION

__all__ = ["KEY_BODY_NAMES", "MOTIONS_DIR", "MotionClip", "MotionFileError", "MotionState", "SCHEMA_VERSION"]
