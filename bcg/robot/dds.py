"""DDS plumbing for the G1: participant configuration, topics, raw readers and writers.

The participant is configured by an XML string built here from the network interface and the
domain id (``CYCLONEDDS_URI`` is ignored once a ``Domain(id, xml)`` is created explicitly). On the
robot's network (domain 0, e.g. ``enp3s0``) discovery uses the interface's multicast; on the
loopback interface, which has no multicast flag on Linux, discovery runs by unicast to 127.0.0.1
with participant indices, so that tests never send to any other address.

Samples are written and taken as XCDR1 bytes through cyclonedds-python's C layer
(``ddspy_write`` / ``ddspy_take``) and converted to and from the messages' C images by
:class:`bcg.robot.dds_types.CdrCodec`; the topics are still registered with the IDL classes of
:mod:`bcg.robot.dds_types`, so the type names and type information on the wire are the binding's own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

import numpy as np
from cyclonedds.core import DDSException, InstanceState, SampleState, ViewState
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic

from bcg.robot import dds_types as dt

_ANY_STATE = SampleState.Any | ViewState.Any | InstanceState.Any

try:  # the C layer of cyclonedds-python (present in 0.10.x and 11.x)
    from cyclonedds._clayer import ddspy_take, ddspy_write
except ImportError as exc:  # pragma: no cover - depends on the installed binding
    raise ImportError("cyclonedds-python without its C layer (_clayer) is not supported") from exc


def _take_with_mask(ref, max_samples):
    return ddspy_take(ref, _ANY_STATE, max_samples)


def _take_without_mask(ref, max_samples):  # cyclonedds-python 0.10.x: ddspy_take(reader, N)
    return ddspy_take(ref, max_samples)


def _take_raw(ref, max_samples):
    global _take_raw
    try:
        ret = _take_with_mask(ref, max_samples)
        _take_raw = _take_with_mask
    except TypeError:
        ret = _take_without_mask(ref, max_samples)
        _take_raw = _take_without_mask
    return ret


ROBOT_DOMAIN = 0
SIM_DOMAIN = 1
LOOPBACK = "lo"
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def participant_config(interface: str, domain: int, max_participants: int = 20) -> str:
    """Cyclone DDS XML configuration for one network interface and domain.

    Args:
        interface: network interface name (``enp3s0`` on the robot's wired network, ``lo`` in tests).
        domain: DDS domain id (0 on the robot, 1 in simulation).
        max_participants: participants per host reachable by unicast discovery on loopback.
    """
    if not _IFACE_RE.match(interface):
        raise ValueError(f"invalid network interface name {interface!r}")
    if not 0 <= domain <= 232:
        raise ValueError(f"DDS domain id must be in 0..232, got {domain}")
    iface = quoteattr(interface)
    if interface == LOOPBACK:
        discovery = (
            "<Discovery><ParticipantIndex>auto</ParticipantIndex>"
            f"<MaxAutoParticipantIndex>{max_participants}</MaxAutoParticipantIndex>"
            '<Peers><Peer address="127.0.0.1"/></Peers></Discovery>'
        )
        multicast = "<AllowMulticast>false</AllowMulticast>"
    else:
        discovery, multicast = "", ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<CycloneDDS xmlns="https://cdds.io/config">'
        f'<Domain Id="{domain}"><General><Interfaces><NetworkInterface name={iface}/></Interfaces>'
        f"{multicast}</General>{discovery}</Domain></CycloneDDS>"
    )


def _writer_qos() -> Qos:
    # Reliable so that it also matches a reliable reader; keep-last 1 so it never blocks or queues.
    return Qos(Policy.Reliability.Reliable(max_blocking_time=0), Policy.History.KeepLast(1))


def _reader_qos(depth: int) -> Qos:
    return Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(depth))


class RawWriter:
    """Writes C images of one message type as XCDR1 samples."""

    def __init__(self, writer: DataWriter, codec: dt.CdrCodec):
        self.writer = writer
        self.codec = codec

    def write(self, image: np.ndarray) -> None:
        """Publish a C image (0-d structured array of the codec's layout)."""
        ret = ddspy_write(self.writer._ref, self.codec.encode(image))
        if ret < 0:
            raise DDSException(ret, f"writing on {self.writer.topic.name}")

    def matched(self) -> int:
        """Number of matched readers."""
        return len(self.writer.get_matched_subscriptions())


class RawReader:
    """Takes samples of one message type as C images."""

    def __init__(self, reader: DataReader, codec: dt.CdrCodec):
        self.reader = reader
        self.codec = codec

    def take(self, max_samples: int = 16) -> list[np.ndarray]:
        """All valid samples waiting (oldest first), as C images; malformed samples are skipped."""
        ret = _take_raw(self.reader._ref, max_samples)
        if isinstance(ret, int):
            raise DDSException(ret, f"taking from {self.reader.topic.name}")
        images = []
        for data, info in ret:
            if info.valid_data:
                try:
                    images.append(self.codec.decode(data))
                except ValueError:
                    continue
        return images

    def matched(self) -> int:
        """Number of matched writers."""
        return len(self.reader.get_matched_publications())


@dataclass
class Channels:
    """Participant with the low-level topics of one side of the link."""

    participant: DomainParticipant
    lowcmd: RawWriter | RawReader
    lowstate: RawWriter | RawReader | None
    topics: tuple[Topic, ...]

    def close(self) -> None:
        """Delete the endpoints, topics and participant now (unmatching the peers at once)."""
        ends = [c for c in (self.lowcmd, self.lowstate) if c is not None]
        endpoints = [c.writer if isinstance(c, RawWriter) else c.reader for c in ends]
        for entity in (*endpoints, *self.topics, self.participant):
            entity.__del__()  # cyclonedds deletes an entity in __del__ and forgets it afterwards


_DOMAINS: dict[int, tuple[str, Domain]] = {}


def _domain(interface: str, domain: int) -> Domain:
    # One Domain object per id and process: Cyclone refuses a second one with the same id.
    config = participant_config(interface, domain)
    if domain in _DOMAINS:
        if _DOMAINS[domain][0] != config:
            raise RuntimeError(
                f"DDS domain {domain} already configured for another interface in this process"
            )
        return _DOMAINS[domain][1]
    handle = Domain(domain, config)
    _DOMAINS[domain] = (config, handle)
    return handle


def open_channels(interface: str, domain: int, side: str, state_depth: int = 1) -> Channels:
    """Create a participant and the ``rt/lowcmd`` / ``rt/lowstate`` endpoints.

    Args:
        interface: network interface name.
        domain: DDS domain id.
        side: "client" (writes LowCmd_, reads LowState_), "robot" (the reverse: the emulator) or
            "commander" (writes LowCmd_ only: the client's guardian process).
        state_depth: history depth of the reader.
    """
    if side not in ("client", "robot", "commander"):
        raise ValueError(f"side must be 'client', 'robot' or 'commander', got {side!r}")
    _domain(interface, domain)
    participant = DomainParticipant(domain)
    cmd_topic = Topic(participant, dt.TOPIC_LOWCMD, dt.LowCmd_)
    if side == "commander":
        lowcmd = RawWriter(DataWriter(participant, cmd_topic, qos=_writer_qos()), dt.LOW_CMD_CODEC)
        return Channels(participant, lowcmd, None, (cmd_topic,))
    state_topic = Topic(participant, dt.TOPIC_LOWSTATE, dt.LowState_)
    if side == "client":
        lowcmd = RawWriter(DataWriter(participant, cmd_topic, qos=_writer_qos()), dt.LOW_CMD_CODEC)
        lowstate = RawReader(
            DataReader(participant, state_topic, qos=_reader_qos(state_depth)), dt.LOW_STATE_CODEC
        )
    else:
        lowcmd = RawReader(DataReader(participant, cmd_topic, qos=_reader_qos(state_depth)), dt.LOW_CMD_CODEC)
        lowstate = RawWriter(DataWriter(participant, state_topic, qos=_writer_qos()), dt.LOW_STATE_CODEC)
    return Channels(participant, lowcmd, lowstate, (cmd_topic, state_topic))


class Ticker:
    """Fixed-rate loop timing on the monotonic clock: sleeps to ~0.3 ms before each deadline, then
    spins, so that the period jitter stays well under a millisecond without burning a core.

    Deadlines advance by exactly one period; after an overrun of more than ``max_lag`` periods the
    schedule restarts from now instead of bursting to catch up.
    """

    def __init__(self, period: float, spin: float = 3e-4, max_lag: int = 5):
        self.period = period
        self.spin = spin
        self.max_lag = max_lag
        self.next = time.perf_counter() + period
        self.overruns = 0

    def wait(self) -> float:
        """Block until the next deadline; returns the wake-up time (perf_counter seconds)."""
        remaining = self.next - time.perf_counter()
        if remaining > self.spin:
            time.sleep(remaining - self.spin)
        while (now := time.perf_counter()) < self.next:
            pass
        if now - self.next > self.max_lag * self.period:
            self.overruns += 1
            self.next = now
        self.next += self.period
        return now
