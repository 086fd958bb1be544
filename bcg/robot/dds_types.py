"""Unitree G1 low-level messages (``unitree_hg``) declared for cyclonedds-python.

The DDS type names, the field order and the field kinds follow Unitree's IDL exactly (see
``docs/robot.md``): every 8-bit unsigned field is the IDL ``octet`` kind (``types.byte``), not
``uint8``, because Cyclone DDS 0.10 on the robot declares them that way and a reader and a writer
that differ in that kind never match. All structs are final and keyless, so they travel as XCDR1.

The ``typename`` keyword puts ``unitree_hg.msg.dds_.LowCmd_`` on the wire as
``unitree_hg::msg::dds_::LowCmd_``.

Besides the message classes this module holds the C-struct layout of each message (numpy
structured dtypes with natural alignment), which the CRC is computed over, and conversions
between the messages and flat numpy arrays used by the control loop.
"""

from dataclasses import dataclass, field

import numpy as np
from cyclonedds.idl import IdlStruct, annotations
from cyclonedds.idl import types as t

#: The IDL octet kind. cyclonedds-python 11.x calls it ``types.byte`` (its ``uint8`` is another kind,
#: TK_UINT8, that the robot's types do not match); 0.10.x has no ``byte`` and maps ``uint8`` to octet.
U8 = t.byte if hasattr(t, "byte") else t.uint8

NUM_MOTORS = 35  # motor slots in every message (29 used on the 29-DoF G1)
REMOTE_BYTES = 40

TOPIC_LOWCMD = "rt/lowcmd"
TOPIC_LOWSTATE = "rt/lowstate"
TOPIC_SECONDARY_IMU = "rt/secondary_imu"


@dataclass
@annotations.final
@annotations.autoid("sequential")
class MotorCmd_(IdlStruct, typename="unitree_hg.msg.dds_.MotorCmd_"):
    """One motor's command: mode (1 enable, 0 disable), target q (rad), dq (rad/s), feed-forward
    tau (N m), gains kp (N m/rad) and kd (N m s/rad)."""

    mode: U8 = 0
    q: t.float32 = 0.0
    dq: t.float32 = 0.0
    tau: t.float32 = 0.0
    kp: t.float32 = 0.0
    kd: t.float32 = 0.0
    reserve: t.uint32 = 0


@dataclass
@annotations.final
@annotations.autoid("sequential")
class LowCmd_(IdlStruct, typename="unitree_hg.msg.dds_.LowCmd_"):
    """Client-to-robot command on ``rt/lowcmd`` (500 Hz)."""

    mode_pr: U8 = 0
    mode_machine: U8 = 0
    motor_cmd: t.array[MotorCmd_, NUM_MOTORS] = field(
        default_factory=lambda: [MotorCmd_() for _ in range(NUM_MOTORS)]
    )
    reserve: t.array[t.uint32, 4] = field(default_factory=lambda: [0, 0, 0, 0])
    crc: t.uint32 = 0


@dataclass
@annotations.final
@annotations.autoid("sequential")
class MotorState_(IdlStruct, typename="unitree_hg.msg.dds_.MotorState_"):
    """One motor's measurement: q (rad), dq (rad/s), ddq (rad/s^2), tau_est (N m), temperatures
    (deg C), voltage (V), sensor and status words."""

    mode: U8 = 0
    q: t.float32 = 0.0
    dq: t.float32 = 0.0
    ddq: t.float32 = 0.0
    tau_est: t.float32 = 0.0
    temperature: t.array[t.int16, 2] = field(default_factory=lambda: [0, 0])
    vol: t.float32 = 0.0
    sensor: t.array[t.uint32, 2] = field(default_factory=lambda: [0, 0])
    motorstate: t.uint32 = 0
    reserve: t.array[t.uint32, 4] = field(default_factory=lambda: [0, 0, 0, 0])


@dataclass
@annotations.final
@annotations.autoid("sequential")
class IMUState_(IdlStruct, typename="unitree_hg.msg.dds_.IMUState_"):
    """IMU: quaternion (w, x, y, z) body-to-world, gyroscope (rad/s, body frame), accelerometer
    (m/s^2, body frame, specific force), rpy (rad), temperature (deg C)."""

    quaternion: t.array[t.float32, 4] = field(default_factory=lambda: [1.0, 0.0, 0.0, 0.0])
    gyroscope: t.array[t.float32, 3] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    accelerometer: t.array[t.float32, 3] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    rpy: t.array[t.float32, 3] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    temperature: t.int16 = 0


@dataclass
@annotations.final
@annotations.autoid("sequential")
class LowState_(IdlStruct, typename="unitree_hg.msg.dds_.LowState_"):
    """Robot-to-client state on ``rt/lowstate`` (500 Hz); ``tick`` counts milliseconds."""

    version: t.array[t.uint32, 2] = field(default_factory=lambda: [0, 0])
    mode_pr: U8 = 0
    mode_machine: U8 = 0
    tick: t.uint32 = 0
    imu_state: IMUState_ = field(default_factory=IMUState_)
    motor_state: t.array[MotorState_, NUM_MOTORS] = field(
        default_factory=lambda: [MotorState_() for _ in range(NUM_MOTORS)]
    )
    wireless_remote: t.array[U8, REMOTE_BYTES] = field(default_factory=lambda: bytes(REMOTE_BYTES))
    reserve: t.array[t.uint32, 4] = field(default_factory=lambda: [0, 0, 0, 0])
    crc: t.uint32 = 0


# C-struct layouts (natural alignment, little-endian): the bytes the CRC is computed over.
MOTOR_CMD_LAYOUT = np.dtype(
    [("mode", "u1"), ("q", "<f4"), ("dq", "<f4"), ("tau", "<f4"), ("kp", "<f4"), ("kd", "<f4"),
     ("reserve", "<u4")],
    align=True,
)  # fmt: skip
LOW_CMD_LAYOUT = np.dtype(
    [("mode_pr", "u1"), ("mode_machine", "u1"), ("motor_cmd", MOTOR_CMD_LAYOUT, (NUM_MOTORS,)),
     ("reserve", "<u4", (4,)), ("crc", "<u4")],
    align=True,
)  # fmt: skip
MOTOR_STATE_LAYOUT = np.dtype(
    [("mode", "u1"), ("q", "<f4"), ("dq", "<f4"), ("ddq", "<f4"), ("tau_est", "<f4"),
     ("temperature", "<i2", (2,)), ("vol", "<f4"), ("sensor", "<u4", (2,)), ("motorstate", "<u4"),
     ("reserve", "<u4", (4,))],
    align=True,
)  # fmt: skip
IMU_STATE_LAYOUT = np.dtype(
    [("quaternion", "<f4", (4,)), ("gyroscope", "<f4", (3,)), ("accelerometer", "<f4", (3,)),
     ("rpy", "<f4", (3,)), ("temperature", "<i2")],
    align=True,
)  # fmt: skip
LOW_STATE_LAYOUT = np.dtype(
    [("version", "<u4", (2,)), ("mode_pr", "u1"), ("mode_machine", "u1"), ("tick", "<u4"),
     ("imu_state", IMU_STATE_LAYOUT), ("motor_state", MOTOR_STATE_LAYOUT, (NUM_MOTORS,)),
     ("wireless_remote", "u1", (REMOTE_BYTES,)), ("reserve", "<u4", (4,)), ("crc", "<u4")],
    align=True,
)  # fmt: skip
assert LOW_CMD_LAYOUT.itemsize == 1004 and LOW_STATE_LAYOUT.itemsize == 2092


def low_cmd_layout(msg: LowCmd_) -> np.ndarray:
    """The C-struct image of a LowCmd_ (a 0-d structured array of :data:`LOW_CMD_LAYOUT`)."""
    out = np.zeros((), LOW_CMD_LAYOUT)
    out["mode_pr"] = msg.mode_pr
    out["mode_machine"] = msg.mode_machine
    out["motor_cmd"] = [(m.mode, m.q, m.dq, m.tau, m.kp, m.kd, m.reserve) for m in msg.motor_cmd]
    out["reserve"] = msg.reserve
    out["crc"] = msg.crc
    return out


def low_state_layout(msg: LowState_) -> np.ndarray:
    """The C-struct image of a LowState_ (a 0-d structured array of :data:`LOW_STATE_LAYOUT`)."""
    out = np.zeros((), LOW_STATE_LAYOUT)
    out["version"] = msg.version
    out["mode_pr"] = msg.mode_pr
    out["mode_machine"] = msg.mode_machine
    out["tick"] = msg.tick
    imu = msg.imu_state
    out["imu_state"] = (imu.quaternion, imu.gyroscope, imu.accelerometer, imu.rpy, imu.temperature)
    out["motor_state"] = [
        (m.mode, m.q, m.dq, m.ddq, m.tau_est, m.temperature, m.vol, m.sensor, m.motorstate, m.reserve)
        for m in msg.motor_state
    ]
    out["wireless_remote"] = np.frombuffer(bytes(msg.wireless_remote), np.uint8)
    out["reserve"] = msg.reserve
    out["crc"] = msg.crc
    return out


def low_cmd_from_layout(image: np.ndarray) -> LowCmd_:
    """A LowCmd_ message with the values of a :data:`LOW_CMD_LAYOUT` image."""
    motors = image["motor_cmd"].tolist()
    return LowCmd_(
        mode_pr=int(image["mode_pr"]),
        mode_machine=int(image["mode_machine"]),
        motor_cmd=[MotorCmd_(*m) for m in motors],
        reserve=image["reserve"].tolist(),
        crc=int(image["crc"]),
    )


def low_state_from_layout(image: np.ndarray) -> LowState_:
    """A LowState_ message with the values of a :data:`LOW_STATE_LAYOUT` image."""
    imu = image["imu_state"]
    return LowState_(
        version=image["version"].tolist(),
        mode_pr=int(image["mode_pr"]),
        mode_machine=int(image["mode_machine"]),
        tick=int(image["tick"]),
        imu_state=IMUState_(
            quaternion=imu["quaternion"].tolist(),
            gyroscope=imu["gyroscope"].tolist(),
            accelerometer=imu["accelerometer"].tolist(),
            rpy=imu["rpy"].tolist(),
            temperature=int(imu["temperature"]),
        ),
        motor_state=[
            MotorState_(m[0], m[1], m[2], m[3], m[4], list(m[5]), m[6], list(m[7]), m[8], list(m[9]))
            for m in image["motor_state"].tolist()
        ],
        wireless_remote=image["wireless_remote"].tobytes(),
        reserve=image["reserve"].tolist(),
        crc=int(image["crc"]),
    )


# XCDR1 little-endian encoding of the same messages, by a byte permutation of the C image.
CDR_LE_HEADER = b"\x00\x01\x00\x00"  # encapsulation: CDR (XCDR1), little-endian, no options


def layout_leaves(layout: np.dtype, offset: int = 0):
    """(C offset, size) of every primitive element of a C layout, in declaration order."""
    for name in layout.names:
        sub, field_offset = layout.fields[name][:2]
        base, shape = sub.subdtype if sub.subdtype else (sub, ())
        for k in range(int(np.prod(shape, dtype=int))):
            start = offset + field_offset + k * base.itemsize
            if base.names:
                yield from layout_leaves(base, start)
            else:
                yield start, base.itemsize


class CdrCodec:
    """Converts between a message's C-struct image and its XCDR1 little-endian serialisation.

    Both encodings hold the same little-endian primitives in the same order and differ only in
    padding: C aligns each struct to its largest member, XCDR1 aligns each primitive to its size
    relative to the start of the payload. Both directions are one numpy gather (about 10 us) in
    place of cyclonedds-python's generic per-field (de)serialiser (0.4-0.7 ms for these messages).

    Args:
        layout: the message's C layout, e.g. :data:`LOW_CMD_LAYOUT`.
    """

    def __init__(self, layout: np.dtype):
        self.layout = layout
        c_index, cdr_index, pos = [], [], 0
        for c_offset, size in layout_leaves(layout):
            pos = (pos + size - 1) // size * size
            c_index.extend(range(c_offset, c_offset + size))
            cdr_index.extend(range(pos, pos + size))
            pos += size
        self.payload_size = pos
        self._c_index = np.array(c_index)
        self._cdr_index = np.array(cdr_index)
        # encode gathers from the C image extended by one zero byte, which fills the CDR padding
        gather = np.full(pos, layout.itemsize)
        gather[self._cdr_index] = self._c_index
        self._encode_gather = gather

    def encode(self, image: np.ndarray) -> bytes:
        """XCDR1-LE bytes (header included, padded to 4 bytes) of a C image (0-d, of ``layout``)."""
        c_bytes = np.frombuffer(image.tobytes() + b"\0", np.uint8)
        payload = c_bytes[self._encode_gather].tobytes()
        return CDR_LE_HEADER + payload + bytes(-len(payload) % 4)

    def decode(self, data: bytes) -> np.ndarray:
        """The C image (0-d array of ``layout``) of XCDR1-LE bytes; ValueError if malformed."""
        if data[:2] != CDR_LE_HEADER[:2]:
            raise ValueError(f"not an XCDR1 little-endian sample (encapsulation {data[:2].hex()})")
        payload = np.frombuffer(data, np.uint8, offset=4)
        if payload.size < self.payload_size:
            raise ValueError(f"sample of {payload.size} payload bytes, expected {self.payload_size}")
        c_bytes = np.zeros(self.layout.itemsize, np.uint8)
        c_bytes[self._c_index] = payload[self._cdr_index]
        return c_bytes.view(self.layout).reshape(())


LOW_CMD_CODEC = CdrCodec(LOW_CMD_LAYOUT)
LOW_STATE_CODEC = CdrCodec(LOW_STATE_LAYOUT)
