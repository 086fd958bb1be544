"""Settings of the sphere-ground contact (:mod:`bcg.sim.contact` holds its kernels)."""

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class ContactConfig:
    """Sphere-ground contact settings.

    Attributes:
        kappa: 1/m, stiffness of the smoothing s_kappa(d) (the paper uses 50, 100, 300).
        friction: ground friction coefficient mu (per environment via ``set_params(friction=...)``).
        iterations: projected Gauss-Seidel sweeps per substep.
        ground_height: m, height of the ground plane.
        activation_margin: m, gap below which a sphere enters the solver; None = 4.6 / kappa.
        depth_correction: beta in [0, 1), a position term (ours, not in Schwarke et al.'s model):
            the solver aims each sphere's normal velocity at beta max(d, 0) / h instead of 0, so a
            loaded foot settles (with beta = 0.2 the standing G1's feet at 2.6 mm for kappa = 300,
            4.4 mm for kappa = 50) instead of sinking as ln(1 + kappa g h t) / kappa, as s_kappa(d) < 1
            leaves part of every step's impulse unapplied. 0, the default, is the paper's model.
        spheres: (body name, (x, y, z) in the body frame) per contact sphere. Required by a
            simulator (it knows no robot); None until given (:func:`bcg.g1sim.make_g1` gives the G1's
            feet).
        radius: m, sphere radius; required as ``spheres`` is.
    """

    kappa: float = 300.0
    friction: float = 0.8
    iterations: int = 10
    ground_height: float = 0.0
    activation_margin: float | None = None
    depth_correction: float = 0.0
    spheres: tuple | None = None
    radius: float | None = None

    def __post_init__(self):
        def positive(name, value):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ContactConfig.{name} must be a positive number, got {value!r}")

        positive("kappa", self.kappa)
        if not (math.isfinite(self.friction) and self.friction >= 0):
            raise ValueError(f"ContactConfig.friction must be >= 0, got {self.friction!r}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise ValueError(f"ContactConfig.iterations must be a positive integer, got {self.iterations!r}")
        if not math.isfinite(self.ground_height):
            raise ValueError(f"ContactConfig.ground_height must be finite, got {self.ground_height!r}")
        if self.activation_margin is not None and not (
            math.isfinite(self.activation_margin) and self.activation_margin >= 0
        ):
            raise ValueError(f"ContactConfig.activation_margin must be >= 0, got {self.activation_margin!r}")
        if not (isinstance(self.depth_correction, (int, float)) and 0 <= self.depth_correction < 1):
            raise ValueError(
                f"ContactConfig.depth_correction must be in [0, 1), got {self.depth_correction!r}"
            )
        if self.radius is not None:
            positive("radius", self.radius)
        if self.spheres is not None:
            spheres = []
            for item in self.spheres:
                try:
                    body, pos = item
                    pos = tuple(float(x) for x in pos)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"ContactConfig.spheres: each sphere is (body name, (x, y, z)), got {item!r}"
                    ) from None
                if not isinstance(body, str) or len(pos) != 3 or not all(map(math.isfinite, pos)):
                    raise ValueError(
                        f"ContactConfig.spheres: each sphere is (body name, (x, y, z)) with finite "
                        f"coordinates, got {item!r}"
                    )
                spheres.append((body, pos))
            if not spheres:
                raise ValueError("ContactConfig.spheres is empty: give at least one sphere, or contact=None")
            object.__setattr__(self, "spheres", tuple(spheres))

    @property
    def margin(self) -> float:
        """m, the activation margin in use: ``activation_margin``, or 4.6 / kappa (s_kappa = 0.01)."""
        return 4.6 / self.kappa if self.activation_margin is None else self.activation_margin


@dataclass(frozen=True)
class SelfContactConfig:
    """Penalty contact between two sets of the robot's own capsules, e.g. its two legs
    (:mod:`bcg.sim.self_contact`; ours: the paper's simulator has foot-ground contact alone).

    Attributes:
        capsules_a, capsules_b: ((body name, (x, y, z), (x, y, z), radius), ...): each capsule's
            axis ends in its body's frame (m; equal ends make a sphere) and radius (m). Every capsule
            of one set meets every capsule of the other. Required by a simulator; None until given
            (:func:`bcg.g1sim.make_g1` gives the G1's legs, :func:`bcg.sim.self_contact.capsules_of`
            reads any MJCF's collision capsules).
        stiffness: N/m, k of f = k delta(d) max(0, 1 - c v_n) along the pair's normal; 0 builds the
            pairs without a force, for a contact that a later stage of a run switches on
            (:meth:`bcg.sim.Simulator.set_self_contact`).
        damping: s/m, c (Hunt and Crossley's: it grows with the depth and never pulls).
        smoothing: 1/m, sigma of the smoothed depth delta(d) = softplus(sigma d) / sigma.
        force_limit: N, L: the force is L f / (L + f), f while small against L and never above it,
            which keeps the explicit contact stable however deep the capsules cross
            (:mod:`bcg.sim.self_contact`).
    """

    capsules_a: tuple | None = None
    capsules_b: tuple | None = None
    stiffness: float = 5000.0
    damping: float = 0.5
    smoothing: float = 1000.0
    force_limit: float = 200.0

    def __post_init__(self):
        for name in ("smoothing", "force_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, numbers.Real) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"SelfContactConfig.{name} must be a positive number, got {value!r}")
        for name in ("stiffness", "damping"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"SelfContactConfig.{name} must be a number >= 0, got {value!r}")
        for name in ("stiffness", "damping", "smoothing", "force_limit"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("capsules_a", "capsules_b"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _capsules(name, value))


def _capsules(name: str, items) -> tuple:
    """``items`` as ((body, (x, y, z), (x, y, z), radius), ...) of floats, or a clear ValueError."""
    out = []
    for item in items:
        try:
            body, end_a, end_b, radius = item
            end_a, end_b = tuple(float(x) for x in end_a), tuple(float(x) for x in end_b)
            radius = float(radius)
        except (TypeError, ValueError):
            raise ValueError(
                f"SelfContactConfig.{name}: each capsule is (body name, (x, y, z), (x, y, z), radius), "
                f"got {item!r}"
            ) from None
        finite = all(map(math.isfinite, (*end_a, *end_b, radius)))
        if not isinstance(body, str) or len(end_a) != 3 or len(end_b) != 3 or not finite or radius <= 0:
            raise ValueError(
                f"SelfContactConfig.{name}: each capsule is (body name, (x, y, z), (x, y, z), radius) with "
                f"finite coordinates and a positive radius, got {item!r}"
            )
        out.append((body, end_a, end_b, radius))
    if not out:
        raise ValueError(f"SelfContactConfig.{name} is empty: give at least one capsule")
    return tuple(out)
