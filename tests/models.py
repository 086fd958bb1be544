"""Small MJCF models written for the tests, so the simulator is checked beyond the G1."""

# A fixed-base chain mixing hinge and slide joints, off-axis anchors, tilted frames and offset CoMs.
CHAIN = """
<mujoco model="chain">
  <option timestep="0.005"/>
  <worldbody>
    <body name="base" pos="0.1 -0.2 1.0" quat="0.9 0.1 0.3 0.2">
      <joint name="h0" type="hinge" axis="0 1 0" pos="0 0 0.05"/>
      <inertial pos="0.02 0.01 -0.1" mass="1.3" diaginertia="0.02 0.03 0.01" quat="0.8 0.2 0.1 0.3"/>
      <body name="slider" pos="0 0.1 -0.2">
        <joint name="s1" type="slide" axis="0.3 0 1"/>
        <inertial pos="0 0 -0.05" mass="0.7" diaginertia="0.004 0.005 0.006"/>
        <body name="link2" pos="0.05 0 -0.15" quat="0.7 0 0.7 0">
          <joint name="h2" type="hinge" axis="1 0.2 0" pos="0.01 0 0.02"/>
          <inertial pos="0.1 0 0" mass="0.9" diaginertia="0.003 0.01 0.012"/>
          <body name="link3" pos="0.2 0 0">
            <joint name="h3" type="hinge" axis="0 0 1" range="-1 1"/>
            <inertial pos="0.08 0.01 0" mass="0.4" diaginertia="0.001 0.003 0.003"/>
          </body>
        </body>
      </body>
      <body name="side" pos="0 -0.1 0">
        <joint name="h4" type="hinge" axis="1 0 0"/>
        <inertial pos="0 -0.1 0" mass="0.5" diaginertia="0.002 0.0015 0.002"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

# A floating box with a ball-jointed link carrying a hinge-jointed tip.
FLOATING = """
<mujoco model="floating">
  <option timestep="0.005"/>
  <worldbody>
    <body name="box" pos="0 0 1">
      <freejoint name="root"/>
      <inertial pos="0.01 0.02 -0.01" mass="2.0" diaginertia="0.05 0.04 0.03" quat="0.9 0.1 0.2 0.1"/>
      <body name="arm" pos="0.2 0 0.1">
        <joint name="ball" type="ball" pos="-0.02 0 0"/>
        <inertial pos="0.15 0 0" mass="0.6" diaginertia="0.002 0.01 0.011"/>
        <body name="tip" pos="0.3 0 0">
          <joint name="tip_hinge" type="hinge" axis="0 1 0"/>
          <inertial pos="0.05 0 0.01" mass="0.2" diaginertia="0.0005 0.001 0.001"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

# A fixed-base arm whose first hinge is limited to +-0.5 rad (joint limits), without gravity.
LIMITED_ARM = """
<mujoco>
  <compiler angle="radian"/>
  <option gravity="0 0 0" timestep="0.005"/>
  <worldbody>
    <body name="arm">
      <joint name="limited" type="hinge" axis="0 1 0" range="-0.5 0.5" limited="true" armature="0.05"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02" mass="1"/>
      <body name="hand" pos="0.3 0 0">
        <joint name="free_hinge" type="hinge" axis="0 1 0" armature="0.05"/>
        <geom type="sphere" size="0.03" mass="0.2"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""
