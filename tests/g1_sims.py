"""Float64 G1 simulators with foot contact, shared by the test modules.

Every new simulator compiles its kernels again, about a minute from a cold cache on a 2-core machine,
so the contact and study tests run on these instances, one per bundle size, and set kappa and the
bundle settings in place (:meth:`Simulator.set_kappa`, :meth:`Simulator.set_bundle_config`).
Without a bundle the size-3 simulator runs with bundling off: plain contact, the same kernels.
"""

ENVS = 6  # environments (the study tests need several; the contact tests read environment 0)
MAX_STEPS = 50  # control steps a window may hold

_SIMS = {}


def g1_contact_sim(kappa: float = 300.0, bundle=None, depth_correction: float = 0.0):
    """The shared simulator for ``bundle``'s size (3 without a bundle), set to ``kappa``,
    ``depth_correction`` and ``bundle`` (None: bundling off), with its trigger statistics reset."""
    import bcg.sim as bs
    from bcg.g1sim import make_g1

    cfg = bundle if bundle is not None else bs.BundleConfig(size=3, enabled=False)
    if cfg.size not in _SIMS:
        _SIMS[cfg.size] = make_g1(
            ENVS, max_steps=MAX_STEPS, contact=bs.ContactConfig(kappa=kappa), bundle=cfg
        )
    sim = _SIMS[cfg.size]
    sim.set_bundle_config(cfg)
    sim.set_contact(kappa=kappa, depth_correction=depth_correction, activation_margin=None, ground_height=0.0)
    sim.reset_stats()
    return sim
