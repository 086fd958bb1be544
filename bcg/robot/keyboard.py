"""Operator input: the wireless remote's buttons, and keyboard keys that mirror them.

The remote's state arrives in ``LowState_.wireless_remote``: bytes 2-3 are a little-endian u16 of
buttons, bit 0..15 = R1, L1, start, select, R2, L2, F1, F2, A, B, X, Y, up, right, down, left.

When no remote is at hand the keyboard stands in: ``s`` = START, ``a`` = A, ``x`` or space = SELECT
(stop and damp). Keys are read without blocking from stdin when it is a terminal (cbreak mode, no
echo, restored at exit), and line by line from an optional control file or FIFO (one button name per
line, e.g. ``start``), which is how scripts and tests press buttons without a TTY.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import termios
import tty

BUTTON_BITS: dict[str, int] = {
    name: bit
    for bit, name in enumerate(
        (
            "r1",
            "l1",
            "start",
            "select",
            "r2",
            "l2",
            "f1",
            "f2",
            "a",
            "b",
            "x",
            "y",
            "up",
            "right",
            "down",
            "left",
        )
    )
}
KEY_TO_BUTTON = {"s": "start", "a": "a", "x": "select", " ": "select"}


def buttons_from_remote(remote: bytes) -> frozenset[str]:
    """Names of the buttons held in a ``wireless_remote`` byte string (40 bytes)."""
    if len(remote) < 4:
        return frozenset()
    word = remote[2] | (remote[3] << 8)
    return frozenset(name for name, bit in BUTTON_BITS.items() if word >> bit & 1)


def remote_with_buttons(names, size: int = 40) -> bytes:
    """A ``wireless_remote`` byte string with the named buttons held (sticks centred)."""
    word = 0
    for name in names:
        if name not in BUTTON_BITS:
            raise ValueError(f"unknown remote button {name!r}; known: {', '.join(BUTTON_BITS)}")
        word |= 1 << BUTTON_BITS[name]
    out = bytearray(size)
    out[2:4] = word.to_bytes(2, "little")
    return bytes(out)


class ButtonEdges:
    """Turns held-button sets into presses (rising edges), so a held button acts once."""

    def __init__(self):
        self._held: frozenset[str] = frozenset()

    def update(self, held: frozenset[str]) -> frozenset[str]:
        pressed = held - self._held
        self._held = held
        return pressed


class KeyInput:
    """Non-blocking key presses from the terminal and/or a control file.

    Args:
        use_stdin: read single keys from stdin when it is a terminal.
        control_path: optional file or FIFO whose new lines name buttons (``start``, ``a``, ``select``).
    """

    def __init__(self, use_stdin: bool = True, control_path: str | None = None):
        self._fd = None
        self._saved = None
        self._control = None
        self._partial = b""
        if control_path is not None:  # first, so a bad path leaves the terminal as it was
            self._control = os.open(control_path, os.O_RDONLY | os.O_NONBLOCK)
            if stat.S_ISDIR(os.fstat(self._control).st_mode):
                os.close(self._control)
                self._control = None
                raise IsADirectoryError(f"control file {control_path!r} is a folder")
        if use_stdin and sys.stdin is not None and sys.stdin.isatty():
            self._fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
            attrs = termios.tcgetattr(self._fd)
            attrs[0] &= ~termios.IXON  # Ctrl-S must not freeze the terminal's output (and the loop)
            termios.tcsetattr(self._fd, termios.TCSANOW, attrs)

    def poll(self) -> list[str]:
        """Buttons pressed since the last call (names of :data:`BUTTON_BITS`)."""
        pressed = []
        if self._fd is not None and select.select([self._fd], [], [], 0)[0]:
            for ch in os.read(self._fd, 64).decode(errors="ignore").lower():
                if ch in KEY_TO_BUTTON:
                    pressed.append(KEY_TO_BUTTON[ch])
        if self._control is not None:
            try:
                chunk = os.read(self._control, 4096)
            except BlockingIOError:
                chunk = b""
            self._partial += chunk
            *lines, self._partial = self._partial.split(b"\n")
            for line in lines:
                name = line.decode(errors="ignore").strip().lower()
                if name in BUTTON_BITS:
                    pressed.append(name)
        return pressed

    def close(self) -> None:
        """Restore the terminal and close the control file."""
        if self._saved is not None:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None
        if self._control is not None:
            os.close(self._control)
            self._control = None
