"""unitree_hg message declarations, C layouts, XCDR1 codec, CRC and participant configuration."""

import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from cyclonedds.idl._typesupport.DDS.XTypes import TK_BYTE

from bcg.robot import crc, dds
from bcg.robot import dds_types as dt


def bitwise_crc(image: bytes) -> int:
    """Independent reference: CRC-32/MPEG-2 bit by bit over each little-endian word's big-endian bytes."""
    reg = 0xFFFFFFFF
    words = struct.unpack(f"<{len(image) // 4}I", image)[:-1]
    for byte in b"".join(struct.pack(">I", w) for w in words):
        reg ^= byte << 24
        for _ in range(8):
            reg = ((reg << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if reg & 0x80000000 else (reg << 1) & 0xFFFFFFFF
    return reg


def random_cmd(rng) -> dt.LowCmd_:
    msg = dt.LowCmd_(mode_pr=0, mode_machine=5, reserve=[1, 2, 3, 0xFFFFFFFF])
    for i, m in enumerate(msg.motor_cmd):
        m.mode = i % 2
        m.q, m.dq, m.tau, m.kp, m.kd = (float(np.float32(v)) for v in rng.normal(size=5))
        m.reserve = i
    return msg


def random_state(rng) -> dt.LowState_:
    msg = dt.LowState_(version=[1, 2], mode_pr=1, mode_machine=6, tick=123456)
    msg.imu_state.quaternion = [float(np.float32(v)) for v in rng.normal(size=4)]
    msg.imu_state.temperature = -7
    for i, m in enumerate(msg.motor_state):
        m.mode = 1
        m.q, m.dq, m.ddq, m.tau_est, m.vol = (float(np.float32(v)) for v in rng.normal(size=5))
        m.temperature = [30 + i, -i]
        m.sensor, m.motorstate = [i, 2 * i], 3 * i
    msg.wireless_remote = bytes(range(40))
    return msg


def test_crc_test_vectors():
    assert crc.crc32_words(np.zeros((), dt.LOW_CMD_LAYOUT)) == 0xFE172F9F
    assert crc.crc32_words(np.zeros((), dt.LOW_STATE_LAYOUT)) == 0xD64BB04A
    assert bitwise_crc(bytes(1004)) == 0xFE172F9F and bitwise_crc(bytes(2092)) == 0xD64BB04A


def test_crc_matches_independent_bitwise_reference():
    rng = np.random.default_rng(1)
    for _ in range(3):
        cmd, state = random_cmd(rng), random_state(rng)
        assert crc.low_cmd_crc(cmd) == bitwise_crc(dt.low_cmd_layout(cmd).tobytes())
        assert crc.low_state_crc(state) == bitwise_crc(dt.low_state_layout(state).tobytes())
    # the crc field itself is not covered, one flipped bit anywhere else changes it
    image = dt.low_cmd_layout(random_cmd(rng))
    before = crc.crc32_words(image)
    image["crc"] = 12345
    assert crc.crc32_words(image) == before
    raw = bytearray(image.tobytes())
    raw[500] ^= 0x10
    assert crc.crc32_words(bytes(raw)) != before


def test_c_layout_offsets():
    assert dt.LOW_CMD_LAYOUT.itemsize == 1004 and dt.LOW_STATE_LAYOUT.itemsize == 2092
    assert dt.MOTOR_CMD_LAYOUT.itemsize == 28 and dt.LOW_CMD_LAYOUT.fields["motor_cmd"][1] == 4
    assert dt.MOTOR_CMD_LAYOUT.fields["q"][1] == 4  # mode, then 3 padding bytes
    assert dt.LOW_STATE_LAYOUT.fields["tick"][1] == 12 and dt.LOW_STATE_LAYOUT.fields["imu_state"][1] == 16
    assert dt.IMU_STATE_LAYOUT.itemsize == 56 and dt.MOTOR_STATE_LAYOUT.itemsize == 56


def test_layout_round_trip():
    rng = np.random.default_rng(2)
    cmd, state = random_cmd(rng), random_state(rng)
    assert dt.low_cmd_from_layout(dt.low_cmd_layout(cmd)) == cmd
    assert dt.low_state_from_layout(dt.low_state_layout(state)) == state


def test_codec_equals_binding_serialiser():
    """The numpy XCDR1 codec produces and reads exactly the bytes of cyclonedds-python's serialiser."""
    rng = np.random.default_rng(3)
    cmd, state = random_cmd(rng), random_state(rng)
    cmd.crc, state.crc = crc.low_cmd_crc(cmd), crc.low_state_crc(state)
    assert dt.LOW_CMD_CODEC.encode(dt.low_cmd_layout(cmd)) == cmd.serialize()
    assert dt.LOW_STATE_CODEC.encode(dt.low_state_layout(state)) == state.serialize()
    assert dt.low_cmd_from_layout(dt.LOW_CMD_CODEC.decode(cmd.serialize())) == cmd
    assert dt.low_state_from_layout(dt.LOW_STATE_CODEC.decode(state.serialize())) == state
    assert dt.LowCmd_.deserialize(dt.LOW_CMD_CODEC.encode(dt.low_cmd_layout(cmd))) == cmd
    with pytest.raises(ValueError, match="little-endian"):
        dt.LOW_CMD_CODEC.decode(b"\x00\x00\x00\x00" + bytes(1000))
    with pytest.raises(ValueError, match="payload bytes"):
        dt.LOW_STATE_CODEC.decode(dt.CDR_LE_HEADER + bytes(100))


def test_type_names_and_u8_kind():
    assert dt.LowCmd_.__idl_typename__ == "unitree_hg.msg.dds_.LowCmd_"
    assert dt.LowState_.__idl_typename__ == "unitree_hg.msg.dds_.LowState_"
    assert dt.IMUState_.__idl_typename__ == "unitree_hg.msg.dds_.IMUState_"
    # field order as in PROTOCOL / Unitree's IDL
    assert list(dt.LowCmd_.__annotations__) == ["mode_pr", "mode_machine", "motor_cmd", "reserve", "crc"]
    assert list(dt.MotorState_.__annotations__) == [
        "mode", "q", "dq", "ddq", "tau_est", "temperature", "vol", "sensor", "motorstate", "reserve",
    ]  # fmt: skip
    # the u8 fields are the octet kind (TK_BYTE) in the type object sent on the wire
    mapping = dt.MotorCmd_.__idl__.get_type_mapping()
    type_obj = mapping.identifier_object_pair_minimal[0].type_object
    members = type_obj.minimal.struct_type.member_seq
    assert members[0].common.member_type_id.discriminator == TK_BYTE  # mode
    assert members[1].common.member_type_id.discriminator != TK_BYTE  # q (float)
    assert dt.LowCmd_.__idl_annotations__.get("extensibility") == "final"


def test_participant_config():
    xml = dds.participant_config("lo", 1)
    root = ET.fromstring(xml)
    ns = {"c": "https://cdds.io/config"}
    domain = root.find("c:Domain", ns)
    assert domain.get("Id") == "1"
    assert domain.find("c:General/c:Interfaces/c:NetworkInterface", ns).get("name") == "lo"
    assert [p.get("address") for p in domain.findall("c:Discovery/c:Peers/c:Peer", ns)] == ["127.0.0.1"]
    robot = ET.fromstring(dds.participant_config("enp3s0", 0)).find("c:Domain", ns)
    assert robot.get("Id") == "0" and robot.find("c:Discovery", ns) is None
    assert robot.find("c:General/c:Interfaces/c:NetworkInterface", ns).get("name") == "enp3s0"
    with pytest.raises(ValueError, match="interface"):
        dds.participant_config('eth0"/><x', 0)
    with pytest.raises(ValueError, match="domain"):
        dds.participant_config("lo", 300)


def test_crc_counts_padding_as_zero():
    """numpy's copy() leaves garbage in padding bytes; the CRC must see C's zero padding."""
    image = dt.low_cmd_layout(random_cmd(np.random.default_rng(4)))
    raw = bytearray(image.tobytes())
    raw[2:4] = b"\xab\xcd"  # the padding after mode_machine
    dirty = np.frombuffer(bytes(raw), dt.LOW_CMD_LAYOUT).reshape(())
    assert crc.crc32_words(dirty) == crc.crc32_words(image) == bitwise_crc(image.tobytes())
    assert crc.crc32_words(image.copy()) == crc.crc32_words(image)
