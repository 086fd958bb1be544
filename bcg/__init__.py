"""bcg: bundled contact gradients for stiff-contact differentiable simulation of humanoid robots."""

__version__ = "0.1.0"
