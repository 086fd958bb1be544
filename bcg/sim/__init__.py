"""bcg.sim."""
