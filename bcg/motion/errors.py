"""The one exception of :mod:`bcg.motion`."""


class MotionFileError(Exception):
    """A motion file (HDF5 clip or source CSV) is missing, malformed or unusable.

    The message names the file and the problem; the command line prints it as ``error: ...`` on
    stderr and exits with status 2.
    """
