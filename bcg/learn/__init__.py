"""bcg.learn."""
