"""bcg.core: the ground floor every other package stands on: the G1's description (joint order,
gains, limits, contact spheres, default pose), its kinematic state, rotation maths and atomic file
writes. It imports no other bcg package."""
