"""bcg.validate: a policy played in MuJoCo: the paper's metrics, the runner, videos, the sim-to-sim
command (``bcg.validate.sim2sim``), the gain sweep and the comparison of two policies' results."""
