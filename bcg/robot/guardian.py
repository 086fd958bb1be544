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
- It answers on its standard output: ``ready`` once its writer exists, then a heartbeat byte every
  10 ms, ``!`` instead while armed and its writer has matched no reader (the robot cannot hear it)
  for a second. The client faults (and damps) when these stop or say ``!``: a guardian that is
  stopped, hung or deaf protects nothing.

Exit status: 0 without a command, :data:`DAMPED` after damping that reached a matched reader at
500 Hz for the damping time, :data:`NOT_DELIVERED` when damping was attempted but not delivered in
full, 1 for an error. What it reports goes to standard error (the client's terminal). What it cannot
cover: the machine itself stopping or losing its network, and the guardian being killed together
with the client by name (``pkill -9 python``); keep the remote's emergency stop at hand.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

from bcg.robot import dds
from bcg.robot.safety import Commander, Fault

COMMAND_DT = 0.002  # s, 500 Hz, as the client
HEARTBEAT = b".\n"  # client -> guardian, every command tick
ANSWER_PERIOD = 0.01  # s between the guardian's heartbeat bytes
DEAF = b"!"  # guardian -> client: armed, and its writer reaches no reader
DAMPED, NOT_DELIVERED = 3, 4  # exit status: damping delivered in full / attempted, not in full


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


def watch(fd: int, stall_after: float, clock=time.monotonic, answer=None) -> tuple[str, int | None]:
    """Read the client's messages from ``fd`` until it is done, gone or stalled.

    ``answer(armed)`` (if given) is called about every 5 ms: the guardian's own heartbeat.

    Returns ``(outcome, mode_machine)``: outcome ``"done"``, ``"gone"`` (end of file) or
    ``"stalled"`` (armed and no heartbeat for ``stall_after`` s); mode_machine is None while unarmed.
    """
    mode_machine: int | None = None
    pending = b""
    last = clock()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.005)
        now = clock()
        if answer is not None:
            answer(mode_machine is not None)
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


class _Answer:
    """The guardian's heartbeat to the client (non-blocking: a client that stopped reading must not
    stop the guardian), ``!`` while armed and deaf for a second."""

    def __init__(self, fd: int, writer: dds.RawWriter):
        self.fd, self.writer = fd, writer
        self.next = time.monotonic()
        self.armed_at: float | None = None
        self.heard = False
        os.set_blocking(fd, False)

    def __call__(self, armed: bool) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + ANSWER_PERIOD
        byte = b"."
        if armed and not self.heard:
            self.armed_at = self.armed_at or now
            self.heard = self.writer.matched() > 0
            if not self.heard and now - self.armed_at > 1.0:
                byte = DEAF
        try:
            os.write(self.fd, byte)
        except OSError:  # full (the client is busy or gone) or closed: the pipe's end says the rest
            pass


def _realtime() -> None:
    """SCHED_FIFO above the client's loop, memory locked (the out-of-memory case); warns if refused."""

    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(60))
        if ctypes.CDLL(None, use_errno=True).mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
            print("guardian: mlockall refused; memory not locked", file=sys.stderr)
    except (PermissionError, OSError, AttributeError) as exc:
        print(f"guardian: real-time priority refused ({exc})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcg.robot.guardian", description=__doc__.split("\n")[0])
    parser.add_argument("--interface", default=dds.LOOPBACK)
    parser.add_argument("--domain", type=int, default=dds.SIM_DOMAIN)
    parser.add_argument("--client", type=int, required=True, help="pid of the client to watch")
    parser.add_argument("--stall-ms", type=float, default=300.0)
    parser.add_argument("--damping-time", type=float, default=1.0)
    parser.add_argument("--kd", type=float, default=8.0)
    parser.add_argument("--realtime", action="store_true", help="SCHED_FIFO 60 and locked memory")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the client's messages (or their end) stop it
    if args.realtime:
        _realtime()
    channels = dds.open_channels(args.interface, args.domain, "commander")
    try:
        os.write(1, b"ready\n")
        outcome, mode_machine = watch(
            sys.stdin.fileno(), args.stall_ms / 1000.0, answer=_Answer(1, channels.lowcmd)
        )
        if outcome == "done" or mode_machine is None:
            return 0
        what = "the client exited without stopping the robot"
        if outcome == "stalled":
            try:
                os.kill(args.client, signal.SIGKILL)
                what = f"the client's command loop stopped for over {args.stall_ms:.0f} ms: client killed"
            except ProcessLookupError:
                pass
            except OSError as exc:  # damp all the same: the client may still write, but damping must go out
                what = (
                    f"the client's command loop stopped for over {args.stall_ms:.0f} ms; "
                    f"killing it failed ({exc})"
                )
        sent = damp(channels.lowcmd.write, mode_machine, args.kd, args.damping_time)
        matched = channels.lowcmd.matched()
        delivered = matched > 0 and sent >= 0.9 * args.damping_time / COMMAND_DT
        print(f"guardian: {what}; damping {'sent' if delivered else 'NOT delivered in full'} for "
              f"{args.damping_time:.1f} s ({sent} commands, {matched} reader(s) matched)",
              file=sys.stderr, flush=True)  # fmt: skip
        return DAMPED if delivered else NOT_DELIVERED
    finally:
        channels.close()


class Guardian:
    """The client's handle on its guardian process (see the module docstring).

    Args:
        interface, domain: where the robot is (the client's own).
        stall_after: s without a heartbeat that count as a stalled command loop (either way: the
            client faults when the guardian's answers stop for as long).
        damping_time: s of damping the guardian sends.
        kd: the damping command's gain.
        startup_timeout: s to wait for the guardian's ``ready``.
        client_pid: the process it kills when the heartbeat stops (default: this one).
        realtime: the guardian runs at SCHED_FIFO 60 (above the client's loop) with locked memory.
    """

    def __init__(self, interface: str, domain: int, stall_after: float, damping_time: float, kd: float,
                 startup_timeout: float = 30.0, client_pid: int | None = None,
                 realtime: bool = False):  # fmt: skip
        self.armed = False
        self.released = False
        self.stall_after = stall_after
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bcg.robot.guardian", "--interface", interface, "--domain", str(domain),
             "--client", str(client_pid or os.getpid()), "--stall-ms", repr(stall_after * 1000.0),
             "--damping-time", repr(damping_time), "--kd", repr(kd), *(["--realtime"] if realtime else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        self._out = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        got, deadline = b"", time.monotonic() + startup_timeout
        while b"ready\n" not in got and time.monotonic() < deadline and self.proc.poll() is None:
            select.select([self._out], [], [], 0.1)
            got += self._read()
        if b"ready\n" not in got:
            self.proc.kill()
            code = self.proc.wait()
            raise RuntimeError(
                f"the guardian process did not start (exit code {code})"
                if code != -9 else f"the guardian process did not start within {startup_timeout:g} s"
            )  # fmt: skip
        self.last_answer = time.monotonic()
        self._in = self.proc.stdin.fileno()
        os.set_blocking(self._in, False)  # a heartbeat never blocks the command loop

    def _read(self) -> bytes:
        try:
            return os.read(self._out, 4096) or b"\0"  # b"\0": end of file, the guardian is gone
        except BlockingIOError:
            return b""

    def _send(self, data: bytes, tries: int = 1) -> bool:
        for _ in range(tries):
            try:
                os.write(self._in, data)
                return True
            except BlockingIOError:  # the pipe is full: the guardian is behind
                time.sleep(0.001)
            except OSError as exc:  # BrokenPipeError: it is gone
                raise Fault(f"the guardian process is gone ({exc.__class__.__name__})") from None
        return False

    def arm(self, mode_machine: int) -> None:
        """From now on the guardian damps if the client dies or stalls."""
        if not self._send(f"arm {int(mode_machine)}\n".encode(), tries=100):
            raise Fault("the guardian process does not read its input")
        self.armed = True

    def beat(self) -> None:
        """One heartbeat (every command tick); never blocks. Fault if the guardian is gone."""
        self._send(HEARTBEAT)

    def check(self, now: float) -> None:
        """Read the guardian's answers (``now``: time.monotonic()); Fault when it has exited, has not
        answered for ``stall_after`` s, or reports that the robot cannot hear it."""
        data = b""
        while chunk := self._read():
            data += chunk
            if chunk == b"\0":
                break
        if data.endswith(b"\0"):
            code = self.proc.poll()  # never blocks the command loop; None if still exiting
            raise Fault(f"the guardian process exited (code {code})")
        if data:
            self.last_answer = now
        if DEAF in data:
            raise Fault(
                "the guardian's command writer reaches no reader: the robot would not hear its damping"
            )
        if now - self.last_answer > self.stall_after:
            raise Fault(f"the guardian process has not answered for {(now - self.last_answer) * 1e3:.0f} ms")

    def release(self, damped: bool) -> None:
        """Hand over at once (before anything that can wait): ``damped`` (the client's own damping
        went out in full) lets the guardian exit without a command; otherwise it damps if armed."""
        if self.released:
            return
        self.released = True
        try:
            if damped:
                self._send(b"done\n", tries=100)
        except Fault:
            pass
        try:
            self.proc.stdin.close()
        except OSError:  # it is gone already
            pass

    def close(self, timeout: float = 5.0) -> int | None:
        """Release (as not damped, unless :meth:`release` came first) and wait up to ``timeout`` s;
        returns the guardian's exit status (None if it is still running)."""
        self.release(damped=False)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            self.proc.stdout.close()
        return code


def describe(code: int | None) -> str:
    """What the client reports of a guardian that was left to damp, from its exit status."""
    if code == DAMPED:
        return "the guardian process sent damping"
    if code == NOT_DELIVERED:
        return "the guardian process could NOT deliver its damping in full"
    if code is None:
        return "the guardian process is still damping"
    return f"the guardian process failed (exit code {code}): no damping is known to have gone out"


if __name__ == "__main__":
    sys.exit(main())
