"""bcg.robot: the G1's constants, MuJoCo validation and the real-robot DDS client."""
