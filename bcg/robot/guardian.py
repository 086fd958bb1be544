"""The run client's guardian: a second process that damps the robot when the client cannot.

The G1's low-level controller keeps executing the last LowCmd_ it received; it has no timeout of
its own. The client (:mod:`bcg.robot.run`) damps on every stop it can see, but a process that is
killed outright (SIGKILL, the out-of-memory killer), stopped (SIGSTOP, a debugger) or stuck (a loop
that stops ticking) cannot. The guardian covers these cases:

- The client starts it (``python -m bcg.robot.guardian``) before its own DDS participant, in a
  session of its own, so that a signal to the client's process group (Ctrl-C, a closed terminal,
  ``kill -9 -PGID``) does not reach it. It opens its own participant with a LowCmd_ writer, so the
  robot has already discovered it when it is needed, and prints ``ready`` on its standard output.
- Over its standard input the client sends ``arm <mode_machine>`` once it has sent its first
  command, a heartbeat line every command tick, and ``done`` after its own damping has gone out.
- End of file on its input without ``done`` (the client died: the kernel closes the pipe whatever
  killed it) while armed: the guardian sends the damping command (kp = 0, kd on every joint,
  q = dq = tau = 0) at 500 Hz for the damping time, then exits.
- No heartbeat for ``--stall-ms`` while armed (the client is alive but its command loop is not
  running): the guardian kills the client with SIGKILL, so that only one writer is left, then damps.
- Unarmed (no command was ever sent), an end of file or ``done`` ends it without a command.

What it reports goes to standard error (the client's terminal). What it cannot cover: the machine
itself stopping or losing its network, and the guardian being killed together with the client by
name or session (``pkill -9 python``); keep the remote's emergency stop at hand.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time

from bcg.robot import dds
from bcg.robot.safety import Commander

COMMAND_DT = 0.002  # s, 500 Hz, as the client
HEARTBEAT = b".\n"


def damp(write, mode_machine: int, kd: float, duration: float) -> int:
    """Send the damping command at 500 Hz for ``duration`` s through ``write(image)``; returns the
    number of commands written (a failing write is retried on the next tick)."""
    commander = Commander()
    ticker = dds.Ticker(COMMAND_DT)
    sent, t_end = 0, time.perf_counter() + duration
    while time.perf_counter() < t_end:
        ticker.wait()
        try:
            write(commander.damping(mode_machine, kd))
            sent += 1
        except Exception:  # a transient write error: the next tick tries again
            pass
    return sent


def watch(fd: int, stall_after: float, clock=time.monotonic) -> tuple[str, int | None]:
    """Read the client's messages from ``fd`` until it is done, gone or stalled.

    Returns ``(outcome, mode_machine)``: outcome ``"done"``, ``"gone"`` (end of file) or
    ``"stalled"`` (armed and no heartbeat for ``stall_after`` s); mode_machine is None while unarmed.
    """
    mode_machine: int | None = None
    pending = b""
    last = clock()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.005)
        now = clock()
        if not ready:
            if mode_machine is not None and now - last > stall_after:
                return "stalled", mode_machine
            continue
        data = os.read(fd, 4096)
        if not data:
            return "gone", mode_machine
        last = now
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if line.startswith(b"arm "):
                mode_machine = int(line[4:])
            elif line == b"done":
                return "done", mode_machine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcg.robot.guardian", description=__doc__.split("\n")[0])
    parser.add_argument("--interface", default=dds.LOOPBACK)
    parser.add_argument("--domain", type=int, default=dds.SIM_DOMAIN)
    parser.add_argument("--client", type=int, required=True, help="pid of the client to watch")
    parser.add_argument("--stall-ms", type=float, default=300.0)
    parser.add_argument("--damping-time", type=float, default=1.0)
    parser.add_argument("--kd", type=float, default=8.0)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the client's messages (or their end) stop it
    channels = dds.open_channels(args.interface, args.domain, "commander")
    try:
        print("ready", flush=True)
        sys.stdout.close()  # the client reads this one line; later reports go to stderr
        outcome, mode_machine = watch(sys.stdin.fileno(), args.stall_ms / 1000.0)
        if outcome == "done" or mode_machine is None:
            return 0
        if outcome == "stalled":
            try:
                os.kill(args.client, signal.SIGKILL)
                what = f"the client's command loop stopped for over {args.stall_ms:.0f} ms: client killed"
            except ProcessLookupError:
                what = "the client exited without stopping the robot"
        else:
            what = "the client exited without stopping the robot"
        sent = damp(channels.lowcmd.write, mode_machine, args.kd, args.damping_time)
        print(f"guardian: {what}; damping sent for {args.damping_time:.1f} s ({sent} commands)",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    finally:
        channels.close()


class Guardian:
    """The client's handle on its guardian process (see the module docstring).

    Args:
        interface, domain: where the robot is (the client's own).
        stall_after: s without a heartbeat that count as a stalled command loop.
        damping_time: s of damping the guardian sends.
        kd: the damping command's gain.
        startup_timeout: s to wait for the guardian's ``ready``.
        client_pid: the process it kills when the heartbeat stops (default: this one).
    """

    def __init__(self, interface: str, domain: int, stall_after: float, damping_time: float, kd: float,
                 startup_timeout: float = 30.0, client_pid: int | None = None):  # fmt: skip
        self.armed = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bcg.robot.guardian", "--interface", interface, "--domain", str(domain),
             "--client", str(client_pid or os.getpid()), "--stall-ms", repr(stall_after * 1000.0),
             "--damping-time", repr(damping_time), "--kd", repr(kd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        ready, _, _ = select.select([self.proc.stdout], [], [], startup_timeout)
        line = self.proc.stdout.readline() if ready else b""
        self.proc.stdout.close()
        if line.strip() != b"ready":
            self.proc.kill()
            code = self.proc.wait()
            raise RuntimeError(
                f"the guardian process did not start (exit code {code})"
                if ready else f"the guardian process did not start within {startup_timeout:g} s"
            )  # fmt: skip
        self._fd = self.proc.stdin.fileno()
        os.set_blocking(self._fd, False)  # a heartbeat never blocks the command loop

    def _send(self, data: bytes, tries: int = 1) -> bool:
        for _ in range(tries):
            try:
                os.write(self._fd, data)
                return True
            except BlockingIOError:  # the pipe is full: the guardian is behind
                time.sleep(0.001)
        return False

    def arm(self, mode_machine: int) -> None:
        """From now on the guardian damps if the client dies or stalls."""
        if not self._send(f"arm {int(mode_machine)}\n".encode(), tries=100):
            raise RuntimeError("the guardian process does not read its input")
        self.armed = True

    def beat(self) -> None:
        """One heartbeat (every command tick); never blocks."""
        self._send(HEARTBEAT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, damped: bool, timeout: float = 5.0) -> int | None:
        """End the guardian: ``damped`` (the client's own damping went out in full) tells it to exit
        without a command; otherwise it damps if armed. Waits up to ``timeout`` s for it; returns its
        exit code (None if it is still running)."""
        try:
            if damped:
                self._send(b"done\n", tries=100)
            self.proc.stdin.close()
        except OSError:  # it is gone already
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


if __name__ == "__main__":
    sys.exit(main())
