"""LowCmd_ and LowState_ exchanged with a real Cyclone DDS 0.10.2 peer (the robot's DDS version).

The peer is a small C program built against Debian's ``cyclonedds-dev`` 0.10.2 with types generated
by its ``idlc`` from an IDL of Unitree's structs (octet for the u8 fields, as on the robot); it computes
Unitree's CRC with the bit loop of Unitree's SDK. The Python side is this package's client and robot
endpoints on the pip-installed cyclonedds 11.x. Both directions are checked: the peer as the robot
(publishes LowState_, reads LowCmd_) and as the client (the reverse), and the peer must not crash.
Installed by ``.ci/install-cyclonedds-0.10.sh``; the test skips only if that could not install it.
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from bcg.robot import crc, dds
from bcg.robot import dds_types as dt

# A domain of this file's own: the test suite runs its files in parallel (.ci/run), and the other DDS
# tests use the simulation domain, 1, on the same loopback interface.
DOMAIN = 2

IDL = """
module unitree_hg { module msg { module dds_ {
@final struct MotorCmd_ { octet mode; float q; float dq; float tau; float kp; float kd;
  unsigned long reserve; };
@final struct LowCmd_ { octet mode_pr; octet mode_machine; MotorCmd_ motor_cmd[35]; unsigned long reserve[4];
  unsigned long crc; };
@final struct MotorState_ { octet mode; float q; float dq; float ddq; float tau_est; short temperature[2];
  float vol; unsigned long sensor[2]; unsigned long motorstate; unsigned long reserve[4]; };
@final struct IMUState_ { float quaternion[4]; float gyroscope[3]; float accelerometer[3]; float rpy[3];
  short temperature; };
@final struct LowState_ { unsigned long version[2]; octet mode_pr; octet mode_machine; unsigned long tick;
  IMUState_ imu_state; MotorState_ motor_state[35]; octet wireless_remote[40]; unsigned long reserve[4];
  unsigned long crc; };
}; }; };
"""

PEER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dds/dds.h"
#include "unitree_hg.h"

/* Unitree SDK's CRC: bit loop over the C struct's 32-bit words, the crc word left out. */
static uint32_t crc32_core(const uint32_t *ptr, uint32_t len) {
  uint32_t xbit, data, crc = 0xFFFFFFFF;
  const uint32_t poly = 0x04c11db7;
  for (uint32_t i = 0; i < len; i++) {
    xbit = 1u << 31; data = ptr[i];
    for (uint32_t bits = 0; bits < 32; bits++) {
      if (crc & 0x80000000) { crc <<= 1; crc ^= poly; } else crc <<= 1;
      if (data & xbit) crc ^= poly;
      xbit >>= 1;
    }
  }
  return crc;
}
#define CRC_OF(msg) crc32_core((const uint32_t *)&(msg), (sizeof(msg) >> 2) - 1)

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: peer robot|client DOMAIN SECONDS XML\n"); return 2; }
  int robot = strcmp(argv[1], "robot") == 0;
  dds_domainid_t domain = (dds_domainid_t)atoi(argv[2]);
  long steps = (long)(atof(argv[3]) * 500.0);
  dds_entity_t dom = dds_create_domain(domain, argv[4]);
  if (dom < 0) { fprintf(stderr, "dds_create_domain: %s\n", dds_strretcode(-dom)); return 1; }
  dds_entity_t pp = dds_create_participant(domain, NULL, NULL);
  dds_entity_t tcmd = dds_create_topic(pp, &unitree_hg_msg_dds__LowCmd__desc, "rt/lowcmd", NULL, NULL);
  dds_entity_t tstate = dds_create_topic(pp, &unitree_hg_msg_dds__LowState__desc, "rt/lowstate", NULL, NULL);
  dds_qos_t *wq = dds_create_qos(), *rq = dds_create_qos();
  dds_qset_reliability(wq, DDS_RELIABILITY_RELIABLE, 0);
  dds_qset_history(wq, DDS_HISTORY_KEEP_LAST, 1);
  dds_qset_reliability(rq, DDS_RELIABILITY_BEST_EFFORT, 0);
  dds_qset_history(rq, DDS_HISTORY_KEEP_LAST, 8);
  dds_entity_t wr = dds_create_writer(pp, robot ? tstate : tcmd, wq, NULL);
  dds_entity_t rd = dds_create_reader(pp, robot ? tcmd : tstate, rq, NULL);
  if (pp < 0 || wr < 0 || rd < 0) { fprintf(stderr, "entity creation failed\n"); return 1; }
  static unitree_hg_msg_dds__LowState_ st, rst;
  static unitree_hg_msg_dds__LowCmd_ cmd, rcmd;
  void *buf[1]; dds_sample_info_t info[1];
  buf[0] = robot ? (void *)&rcmd : (void *)&rst;
  long received = 0, crc_ok = 0;
  unsigned mm = 0, mode1 = 0, mode30 = 0, tick = 0, buttons = 0;
  float q1 = 0.f, kp1 = 0.f, kd1 = 0.f, kp30 = 0.f;
  for (long k = 0; k < steps; k++) {
    if (robot) {
      memset(&st, 0, sizeof st);
      st.mode_machine = 5; st.tick = (uint32_t)(k * 2); st.imu_state.quaternion[0] = 1.0f;
      for (int i = 0; i < 35; i++) { st.motor_state[i].q = 0.01f * i; st.motor_state[i].mode = 1; }
      st.wireless_remote[2] = 0x04;  /* START */
      st.crc = CRC_OF(st);
      dds_write(wr, &st);
    } else {
      memset(&cmd, 0, sizeof cmd);
      cmd.mode_machine = (uint8_t)mm;
      for (int i = 0; i < 29; i++) { cmd.motor_cmd[i].mode = 1; cmd.motor_cmd[i].q = 0.1f * i;
        cmd.motor_cmd[i].kp = 40.0f; cmd.motor_cmd[i].kd = 2.0f; }
      cmd.crc = CRC_OF(cmd);
      dds_write(wr, &cmd);
    }
    while (dds_take(rd, buf, info, 1, 1) > 0) {
      if (!info[0].valid_data) continue;
      received++;
      if (robot) {
        crc_ok += rcmd.crc == CRC_OF(rcmd);
        mm = rcmd.mode_machine; q1 = rcmd.motor_cmd[1].q;
        kp1 = rcmd.motor_cmd[1].kp; kd1 = rcmd.motor_cmd[1].kd;
        mode1 = rcmd.motor_cmd[1].mode; mode30 = rcmd.motor_cmd[30].mode; kp30 = rcmd.motor_cmd[30].kp;
      } else {
        crc_ok += rst.crc == CRC_OF(rst);
        mm = rst.mode_machine; q1 = rst.motor_state[1].q; tick = rst.tick;
        buttons = rst.wireless_remote[2] | (rst.wireless_remote[3] << 8);
      }
    }
    dds_sleepfor(DDS_MSECS(2));
  }
  printf("received=%ld crc_ok=%ld mode_machine=%u q1=%.4f kp1=%.3f kd1=%.3f mode1=%u mode30=%u kp30=%.3f "
         "tick=%u buttons=%u\n", received, crc_ok, mm, q1, kp1, kd1, mode1, mode30, kp30, tick, buttons);
  fflush(stdout);
  dds_delete(pp);
  dds_delete(dom);
  return 0;
}
"""


def _skip_reason() -> str | None:
    for tool in ("idlc", "gcc", "pkg-config"):
        if shutil.which(tool) is None:
            return f"{tool} not found: Cyclone DDS 0.10.2 (cyclonedds-dev) is not installed"
    version = subprocess.run(["idlc", "-v"], capture_output=True, text=True).stdout
    if "0.10." not in version:
        return f"idlc is not Cyclone DDS 0.10.x ({version.strip()!r})"
    if subprocess.run(["pkg-config", "--exists", "CycloneDDS"]).returncode != 0:
        return "pkg-config finds no CycloneDDS (cyclonedds-dev 0.10.2 not installed)"
    return None


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason + "; run .ci/install-cyclonedds-0.10.sh")
    build = tmp_path_factory.mktemp("peer010")
    (build / "unitree_hg.idl").write_text(IDL)
    (build / "peer.c").write_text(PEER_C)
    subprocess.run(["idlc", "unitree_hg.idl"], cwd=build, check=True)
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "CycloneDDS"], capture_output=True, text=True, check=True
    ).stdout.split()
    subprocess.run(
        ["gcc", "-O1", "-o", "peer", "peer.c", "unitree_hg.c", "-I.", *flags], cwd=build, check=True
    )
    # the binary must really link the 0.10 library
    ldd = subprocess.run(["ldd", str(build / "peer")], capture_output=True, text=True).stdout
    assert "libddsc.so.0" in ldd, ldd
    return build / "peer"


def _run_peer(peer, role: str, seconds: float) -> subprocess.Popen:
    xml = dds.participant_config("lo", DOMAIN)
    cmd = [str(peer), role, str(DOMAIN), str(seconds), xml]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _parse(out: str) -> dict[str, float]:
    return {k: float(v) for k, v in (item.split("=") for item in out.split())}


def _finish(proc: subprocess.Popen) -> dict[str, float]:
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, f"0.10.2 peer exited with {proc.returncode} (crash?): {err}"
    return _parse(out)


def test_peer_010_as_robot(peer):
    """Our 11.x client reads the 0.10.2 robot's LowState_ and its commands reach the robot."""
    proc = _run_peer(peer, "robot", 3.0)
    channels = dds.open_channels("lo", DOMAIN, "client")
    states, good, mode_machine = 0, 0, 0
    try:
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            for image in channels.lowstate.take():
                states += 1
                good += crc.crc32_words(image) == int(image["crc"])
                mode_machine = int(image["mode_machine"])
                q1 = float(image["motor_state"]["q"][1])
                buttons = int.from_bytes(image["wireless_remote"][2:4].tobytes(), "little")
            cmd = np.zeros((), dt.LOW_CMD_LAYOUT)
            cmd["mode_machine"] = mode_machine
            motors = cmd["motor_cmd"]
            motors["mode"][:29], motors["q"][:29], motors["kp"][:29], motors["kd"][:29] = 1, 0.5, 30.0, 1.5
            cmd["crc"] = crc.low_cmd_crc(cmd)
            channels.lowcmd.write(cmd)
            time.sleep(0.002)
    finally:
        channels.close()
    result = _finish(proc)
    assert states > 300 and good == states  # every state the 0.10.2 peer sent passes our CRC check
    assert mode_machine == 5 and q1 == pytest.approx(0.01) and buttons == 0x04
    assert result["received"] > 300 and result["crc_ok"] == result["received"]  # Unitree's CRC accepts ours
    assert result["mode_machine"] == 5 and result["q1"] == pytest.approx(0.5) and result["kp1"] == 30.0
    assert result["kd1"] == 1.5 and result["mode1"] == 1 and result["mode30"] == 0 and result["kp30"] == 0


def test_peer_010_as_client(peer):
    """The 0.10.2 peer as a client: it reads our LowState_ and its LowCmd_ reaches our robot side."""
    proc = _run_peer(peer, "client", 3.0)
    channels = dds.open_channels("lo", DOMAIN, "robot")
    commands, good, tick = 0, 0, 0
    try:
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            for image in channels.lowcmd.take():
                commands += 1
                good += crc.crc32_words(image) == int(image["crc"])
                q_cmd, kp_cmd = image["motor_cmd"]["q"].copy(), image["motor_cmd"]["kp"].copy()
            state = np.zeros((), dt.LOW_STATE_LAYOUT)
            state["tick"], state["mode_machine"] = tick, 6
            state["imu_state"]["quaternion"][0] = 1.0
            state["motor_state"]["q"] = 0.25
            state["wireless_remote"][2:4] = (0x00, 0x01)  # A
            state["crc"] = crc.low_state_crc(state)
            channels.lowstate.write(state)
            tick += 2
            time.sleep(0.002)
    finally:
        channels.close()
    result = _finish(proc)
    assert commands > 300 and good == commands
    np.testing.assert_allclose(q_cmd[:29], 0.1 * np.arange(29), rtol=1e-6)
    assert np.all(kp_cmd[:29] == 40.0) and np.all(kp_cmd[29:] == 0)
    assert result["received"] > 300 and result["crc_ok"] == result["received"]
    assert result["mode_machine"] == 6 and result["q1"] == 0.25 and result["buttons"] == 0x100
    assert 0 < result["tick"] <= tick


def _binding_010() -> str | None:
    path = os.environ.get("BCG_CYCLONEDDS_010", os.path.expanduser("~/.cache/bcg/cyclonedds-0.10.2"))
    return path if os.path.isfile(os.path.join(path, "cyclonedds", "__init__.py")) else None


@pytest.mark.slow
def test_client_on_the_010_binding(peer):
    """The fallback: this client on cyclonedds-python 0.10.2 (built against Debian's libddsc 0.10.2)
    passes the same exchanges with the 0.10.2 peer."""
    binding = _binding_010()
    if binding is None:
        pytest.skip("cyclonedds-python 0.10.2 not built; run .ci/install-cyclonedds-0.10.sh")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([binding, os.getcwd()])}
    check = (
        "import cyclonedds.core, sys; sys.exit(0 if cyclonedds.core.__file__.startswith(sys.argv[1]) else 1)"
    )
    assert subprocess.run([sys.executable, "-c", check, binding], env=env).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{__file__}::test_peer_010_as_robot", f"{__file__}::test_peer_010_as_client"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
