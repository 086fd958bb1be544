"""bcg.robot: deployment on the real G1: the DDS types, CRC and client, the safety supervisor and
guardian, the keyboard, the state estimator, the emulator and the robot loop (``bcg.robot.run``)."""
