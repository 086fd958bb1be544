"""Sphere-ground contact and bundled contact gradients (float64)."""

import mujoco
import numpy as np
import pytest
from scipy import special, stats

from bcg.core import g1
from tests.g1_sims import g1_contact_sim
from tests.numeric import central_difference
from tests.sim_reference import contact_reference

KAPPAS = (50.0, 100.0, 300.0)


def make(kappa=300.0, bundle=None, depth_correction=0.0):
    """A shared float64 G1 simulator (:mod:`tests.g1_sims`) of several identical environments;
    the tests read environment 0."""
    return g1_contact_sim(kappa, bundle, depth_correction)


def settled_state(kappa=300.0, steps=12):
    """The G1 in its default pose after settling onto the ground (all eight spheres engaged)."""
    sim = make(kappa=kappa)
    q = g1.default_qpos(sim.mjmodel)[None].copy()
    q[:, 2] -= 0.005
    sim.set_state(q, 0.0)
    for _ in range(steps):
        sim.step(g1.DEFAULT_JOINT_POS[None])
    return sim.qpos_now.copy(), sim.qvel_now.copy()


@pytest.fixture(scope="module")
def standing(ti64):
    return settled_state()


@pytest.mark.parametrize("depth_correction", [0.0, 0.2])
def test_gradients_through_engaged_contact_match_finite_differences(standing, depth_correction):
    """Through the solver with every sphere engaged, with and without the position term."""
    qpos0, qvel0 = standing
    sim = make(depth_correction=depth_correction)
    sim.set_state(qpos0, qvel0)
    sim.step(g1.DEFAULT_JOINT_POS[None])
    depth = sim.penetration()
    assert depth.min() > 2e-3, "every sphere should be well inside its activation band"
    rng = np.random.default_rng(0)
    wq = rng.normal(size=(1, sim.nq))
    wv = rng.normal(size=(1, sim.nv))
    ctrl = g1.DEFAULT_JOINT_POS[None, None] + rng.uniform(-0.05, 0.05, (2, 1, 29))
    ctrl = np.repeat(ctrl, sim.num_envs, axis=1)  # one column per environment: a difference moves env 0 only

    def loss(qp, qv, ct):
        sim.set_state(qp, qv)
        sim.rollout(ct)
        return float((sim.qpos_now * wq).sum() + (sim.qvel_now * wv).sum())

    loss(qpos0, qvel0, ctrl)
    g = sim.backward({sim.substep: wq}, {sim.substep: wv})
    checks = [
        ("qpos z", g.qpos[0, 2], central_difference(lambda x: loss(x, qvel0, ctrl), qpos0, (0, 2))),
        ("qpos x", g.qpos[0, 0], central_difference(lambda x: loss(x, qvel0, ctrl), qpos0, (0, 0))),
        ("qpos ankle", g.qpos[0, 11], central_difference(lambda x: loss(x, qvel0, ctrl), qpos0, (0, 11))),
        ("qvel z", g.qvel[0, 2], central_difference(lambda x: loss(qpos0, x, ctrl), qvel0, (0, 2))),
        ("qvel knee", g.qvel[0, 9], central_difference(lambda x: loss(qpos0, x, ctrl), qvel0, (0, 9))),
        ("ctrl knee", g.ctrl[0, 0, 3], central_difference(lambda x: loss(qpos0, qvel0, x), ctrl, (0, 0, 3))),
        (
            "ctrl ankle",
            g.ctrl[1, 0, 10],
            central_difference(lambda x: loss(qpos0, qvel0, x), ctrl, (1, 0, 10)),
        ),
    ]
    for name, analytic, numeric in checks:
        assert abs(analytic - numeric) <= 1e-4 * max(abs(numeric), 1.0), f"{name}: {analytic} vs {numeric}"


#: Joint offsets from the default pose (indices into g1.JOINT_NAMES) that leave ``count`` spheres in
#: the solver once the lowest sphere sits 4 mm deep; every other sphere is over 2.5 cm above the ground.
PARTIAL_POSES = {
    2: {0: -0.4, 3: 0.8, 10: 0.2},  # left foot lifted, right foot on its toes
    4: {0: -0.4, 3: 0.8},  # left foot lifted, right foot flat
    6: {0: -0.3, 3: 0.6, 4: 0.24},  # right foot flat, left foot on its toes
}


def partial_contact_state(sim, count):
    q = g1.default_qpos(sim.mjmodel)[None].repeat(sim.num_envs, 0)
    for j, dq in PARTIAL_POSES[count].items():
        q[:, 7 + j] += dq
    bottom = sim.sphere_positions(q)[0, :, 2] - sim.sphere_radius - sim.contact.ground_height
    q[:, 2] -= bottom.min() + 0.004
    return q


@pytest.mark.parametrize("count", sorted(PARTIAL_POSES))
def test_solver_visits_the_candidate_spheres_alone(ti64, count):
    """The solve, the Delassus products and the sweeps skip the spheres out of the solver (their
    impulses are exact zeros). With 2, 4 and 6 of 8 spheres engaged (one or two blocks of the
    gathered solve): the listed spheres are the candidates, G over them is J M^-1 J^T, the dense
    reference sweep reproduces every stored iterate, and gradients over two control steps agree
    with central differences."""
    sim = make()
    qpos0 = partial_contact_state(sim, count)
    gap = sim.sphere_positions(qpos0)[0, :, 2] - sim.sphere_radius - sim.contact.ground_height
    margin = float(sim.ground.con_margin[None])
    assert (gap <= margin).sum() == count
    assert np.all((gap < -2e-3) | (gap > margin + 1e-2)), "away from the activation switches"
    ctrl = np.repeat(qpos0[None, :, 7:], 2, axis=0)  # hold the pose
    sim.set_state(qpos0, 0.0)
    sim.step(ctrl[0])
    listed = sim.ground.con_list.to_numpy()[0, : int(sim.ground.con_count[0])]
    np.testing.assert_array_equal(listed, np.flatnonzero(sim.ground.con_active.to_numpy()[0] > 0))
    assert len(listed) == count
    rows = (3 * listed[:, None] + np.arange(3)).ravel()
    jac, mass = sim.ground.jac.to_numpy()[0][rows], sim.dyn.mass.to_numpy()[0]
    np.testing.assert_allclose(
        sim.ground.delassus.to_numpy()[0][np.ix_(rows, rows)],
        jac @ np.linalg.solve(mass, jac.T),
        rtol=1e-9,
        atol=1e-12,
    )
    stored = sim.ground.impulse.to_numpy()
    assert np.abs(stored[:, 0, listed, 2]).max() > 0
    assert np.all(np.delete(stored[:, 0], listed, axis=1) == 0.0)
    for it in range(sim.contact.iterations):
        contact_reference(sim).pgs_sweep(it)  # the dense, unrolled reference over all eight spheres
    np.testing.assert_allclose(sim.ground.impulse.to_numpy(), stored, rtol=1e-12, atol=1e-12)

    rng = np.random.default_rng(count)
    wq, wv = rng.normal(size=(1, sim.nq)), rng.normal(size=(1, sim.nv))
    qvel0 = np.zeros((sim.num_envs, sim.nv))

    def loss(qp, qv, ct):
        sim.set_state(qp, qv)
        sim.rollout(ct)
        return float((sim.qpos_now[:1] * wq).sum() + (sim.qvel_now[:1] * wv).sum())

    loss(qpos0, qvel0, ctrl)
    assert int(sim.ground.con_count[0]) == count, "no sphere crossed the activation margin"
    g = sim.backward(
        {sim.substep: np.repeat(wq, sim.num_envs, 0) * (np.arange(sim.num_envs) == 0)[:, None]},
        {sim.substep: np.repeat(wv, sim.num_envs, 0) * (np.arange(sim.num_envs) == 0)[:, None]},
    )
    checks = [
        ("qpos z", g.qpos[0, 2], central_difference(lambda x: loss(x, qvel0, ctrl), qpos0, (0, 2))),
        (
            "qpos right knee",
            g.qpos[0, 7 + 9],
            central_difference(lambda x: loss(x, qvel0, ctrl), qpos0, (0, 7 + 9)),
        ),
        ("qvel x", g.qvel[0, 0], central_difference(lambda x: loss(qpos0, x, ctrl), qvel0, (0, 0))),
        (
            "ctrl right ankle",
            g.ctrl[0, 0, 10],
            central_difference(lambda x: loss(qpos0, qvel0, x), ctrl, (0, 0, 10)),
        ),
    ]
    for name, analytic, numeric in checks:
        assert abs(numeric) > 1e-6, f"{name}: not exercised"
        assert abs(analytic - numeric) <= 1e-4 * max(abs(numeric), 1.0), f"{name}: {analytic} vs {numeric}"


def _sliding_step(sim, qpos0, qvel0):
    """One control step of the robot sliding forward over the ground (some spheres on the friction
    cone's edge, the projection's scaling branch): the solver's fields then hold the step's last
    substep."""
    qvel = qvel0.copy()
    qvel[0, 0] = 0.6
    sim.set_state(qpos0, qvel)
    sim.step(g1.DEFAULT_JOINT_POS[None])
    imp = sim.ground.impulse.to_numpy()[:, 0]  # (iterations + 1, spheres, 3)
    tangent, normal = np.linalg.norm(imp[..., :2], axis=-1), imp[..., 2]
    mu = float(sim.get_param("friction")[0])
    on_edge = (normal > 0) & np.isclose(tangent, mu * normal, rtol=1e-9)
    assert on_edge[1:].sum() >= 4, "some spheres should slide (impulse on the friction cone)"
    assert ((normal > 0) & ~on_edge)[1:].any() or (normal[1:] == 0).any()


def _sweep_fields(sim):
    g = sim.ground
    return [g.delassus, g.con_vel, g.con_scale, g.con_step, g.con_active, g.impulse]


def test_hand_written_solver_sweep_adjoint_matches_finite_differences(standing):
    """The reverse pass uses a hand-written adjoint of each Gauss-Seidel sweep (impulse[it] ->
    impulse[it + 1]); its partials with respect to every input of the sweep (G, c, s, r, the activity
    mask and the previous iterate) must equal central differences of the forward sweep in float64,
    on a sliding foot as well as on sticking and idle spheres."""
    qpos0, qvel0 = standing
    sim = make()
    _sliding_step(sim, qpos0, qvel0)
    rng = np.random.default_rng(5)
    n_it = sim.contact.iterations
    for it in (0, 1, n_it // 2, n_it - 1):
        upstream = rng.normal(size=(sim.ncon, 3))
        fields = _sweep_fields(sim)
        for f in fields:
            f.grad.fill(0)
        grad_out = np.zeros(sim.ground.impulse.grad.shape + (3,))
        grad_out[it + 1, 0] = upstream
        sim.ground.impulse.grad.from_numpy(grad_out)
        contact_reference(sim).pgs_sweep_adjoint(it)
        hand = {f: f.grad.to_numpy() for f in fields}
        names = dict(zip(fields, ["delassus", "con_vel", "con_scale", "con_step", "con_active", "impulse"]))

        def loss(it=it, upstream=upstream):
            contact_reference(sim).pgs_sweep(it)
            return sum(
                float(np.dot(sim.ground.impulse[it + 1, 0, i].to_numpy(), upstream[i]))
                for i in range(sim.ncon)
            )

        stepped = sim.ground.impulse.to_numpy()[it + 1]
        base = loss()
        # the differentiable reference sweep reproduces what the step's own (rolled) sweep stored
        np.testing.assert_allclose(sim.ground.impulse.to_numpy()[it + 1], stepped, rtol=1e-12, atol=1e-12)
        checked = 0
        for f in fields:
            shape = f.shape[1:] if f is not sim.ground.impulse else ()
            entries = (
                [(it, 0, i) for i in range(sim.ncon)]
                if f is sim.ground.impulse
                else [(0, *i) for i in np.ndindex(shape)]
            )
            for key in entries:
                x0 = f[key].to_numpy() if f is sim.ground.impulse else float(f[key])
                for c in range(3) if f is sim.ground.impulse else [None]:
                    x = float(x0[c]) if c is not None else x0
                    h = 1e-6 * max(abs(x), 1e-2)
                    out = []
                    for sign in (1.0, -1.0):
                        if c is None:
                            f[key] = x + sign * h
                        else:
                            v = x0.copy()
                            v[c] = x + sign * h
                            f[key] = v
                        out.append(loss())
                    f[key] = x0
                    numeric = (out[0] - out[1]) / (2 * h)
                    analytic = hand[f][key if c is None else (*key, c)]
                    assert abs(analytic - numeric) <= 1e-6 * max(abs(numeric), 1.0), (
                        f"sweep {it}: {names[f]}{list(key)} {c}: "
                        f"hand {analytic} vs central difference {numeric}"
                    )
                    checked += abs(numeric) > 1e-8
        assert loss() == base  # the fields are restored
        assert checked > 50, "too few partials exercised"


@pytest.mark.slow  # Taichi's generated adjoint of the sweep takes about 3 minutes to compile in float64
def test_hand_written_solver_sweep_adjoint_matches_the_generated_one(standing):
    """Taichi's generated adjoint of the same sweep gives the same partials as the hand-written one,
    to round-off."""
    qpos0, qvel0 = standing
    sim = make()
    _sliding_step(sim, qpos0, qvel0)
    outputs = _sweep_fields(sim)
    rng = np.random.default_rng(5)
    upstream = rng.normal(size=sim.ground.impulse.grad.shape + (3,))
    for it in range(sim.contact.iterations):
        results = []
        reference = contact_reference(sim)
        for adjoint in (reference.pgs_sweep.grad, reference.pgs_sweep_adjoint):
            for f in outputs:
                f.grad.fill(0)
            sim.ground.impulse.grad.from_numpy(upstream)
            adjoint(it)
            results.append(
                [f.grad.to_numpy()[:, 0] if f is sim.ground.impulse else f.grad.to_numpy() for f in outputs]
            )
        for f, generated, hand in zip(outputs, *results):
            scale = max(np.abs(generated).max(), 1e-12)
            np.testing.assert_allclose(
                hand, generated, rtol=0, atol=1e-11 * scale, err_msg=f"sweep {it}: {f}"
            )


def test_fused_sweep_adjoint_equals_the_sweeps_in_reverse(standing):
    """The reverse pass runs every sweep's adjoint in one launch (``pgs_adjoint``); it must give what
    the per-sweep adjoints give when called from the last sweep to the first (to round-off: the two
    kernels are compiled apart)."""
    qpos0, qvel0 = standing
    sim = make()
    qvel = qvel0.copy()
    qvel[0, 0] = 0.6  # sliding: the projection's scaling branch is taken
    sim.set_state(qpos0, qvel)
    sim.step(g1.DEFAULT_JOINT_POS[None])
    outputs = _sweep_fields(sim)
    upstream = np.random.default_rng(7).normal(size=sim.ground.impulse.grad.shape + (3,))
    results = []
    for run in (
        lambda: [
            contact_reference(sim).pgs_sweep_adjoint(it) for it in reversed(range(sim.contact.iterations))
        ],
        sim.pgs_adjoint,
    ):
        for f in outputs:
            f.grad.fill(0)
        sim.ground.impulse.grad.from_numpy(upstream)
        run()
        results.append([f.grad.to_numpy() for f in outputs])
    for f, chained, fused in zip(outputs, *results):
        assert np.abs(chained).max() > 0 or f is sim.ground.con_active, f
        scale = max(np.abs(chained).max(), 1e-12)
        np.testing.assert_allclose(fused, chained, rtol=0, atol=1e-12 * scale, err_msg=str(f))


@pytest.mark.parametrize("stage", ["rhs", "velocity"])
def test_hand_written_contact_adjoints_match_the_generated_ones(standing, stage):
    """The reverse pass uses hand-written adjoints of the contact Jacobian / right-hand sides and of
    the post-contact velocity (sums over the dofs by one thread, no atomics); Taichi's generated
    adjoints of the same stages must give the same partials."""
    qpos0, qvel0 = standing
    sim = make()
    qvel = qvel0.copy()
    qvel[0, 0] = 0.6
    sim.set_state(qpos0, qvel)
    sim.step(g1.DEFAULT_JOINT_POS[None])
    s = sim.substep - 1
    if stage == "rhs":
        outputs = [sim.ground.rhs_m, sim.ground.jac]
        inputs = [
            sim.dyn.qfrc_total,
            sim.dyn.qfrc_bias,
            sim.dyn.cdof_ang,
            sim.dyn.cdof_lin,
            sim.ground.con_point,
            sim.dyn.xpos,
        ]
        generated, hand = sim._g_contact_rhs.grad, sim.contact_rhs_adjoint
    else:
        outputs = [sim.state.qvel]
        inputs = [sim.ground.sol_m, sim.ground.impulse, sim.ground.con_scale]
        generated, hand = sim._g_contact_velocity.grad, sim.contact_velocity_adjoint
    rng = np.random.default_rng(9)
    upstream = [rng.normal(size=f.grad.to_numpy().shape) for f in outputs]
    results = []
    for adjoint in (generated, hand):
        for f in inputs:
            f.grad.fill(0)
        for f, u in zip(outputs, upstream):
            f.grad.from_numpy(u)
        adjoint(s)
        results.append([f.grad.to_numpy() for f in inputs + outputs])
    for f, gen, mine in zip(inputs + outputs, *results):
        scale = max(np.abs(gen).max(), 1e-12)
        np.testing.assert_allclose(mine, gen, rtol=0, atol=1e-11 * scale, err_msg=str(f))
    for f, gen in zip(inputs, results[0]):
        assert np.abs(gen).max() > 0, f"{f}: the partial is not exercised"


@pytest.mark.parametrize(
    "size, horizon, sampling",
    [
        (2, 2, "gaussian"),
        (3, 1, "gaussian"),
        (2, 2, "antithetic"),  # the draws do not enter the mechanism; same simulators, settings swapped
        (3, 1, "latin"),
        (3, 1, "phase"),
    ],
)
def test_bundle_gradient_is_the_mean_of_branch_gradients(standing, size, horizon, sampling):
    import bcg.sim as bs
    from bcg.sim.bundle import perturbations

    qpos0, qvel0 = standing
    if sampling == "phase":  # copies shifted in time along the motion: give the state some motion
        qvel0 = qvel0 + np.random.default_rng(7).normal(0.0, 0.2, qvel0.shape)
    cfg = bs.BundleConfig(size=size, horizon=horizon, threshold=0.0, seed=11, sampling=sampling)
    rng = np.random.default_rng(3)
    wq = rng.normal(size=(1, 36))
    wq[:, 3:7] = 0.0  # the bundle renormalises the mean quaternion: keep the loss linear in the copies
    wv = rng.normal(size=(1, 35))
    ctrl = g1.DEFAULT_JOINT_POS[None, None] + rng.uniform(-0.05, 0.05, (horizon, 1, 29))

    sim = make(bundle=cfg)
    sim.set_state(qpos0, qvel0)
    sim.rollout(ctrl)
    assert sim.bundle_stats()["triggers"] == sim.num_envs  # identical environments, each bundled
    bundled_loss = float((sim.qpos_now[0] * wq[0]).sum() + (sim.qvel_now[0] * wv[0]).sum())
    gb = sim.backward({sim.substep: wq}, {sim.substep: wv})  # environment 0's bundle is checked

    dq, dv = perturbations(
        sim.mjmodel, qpos0.astype(float), sim._perturb_bodies, cfg, np.random.default_rng(11), qvel0, sim.dt
    )
    ref = make()
    losses, grads = [], []
    for b in range(size):
        ref.set_state(qpos0 + dq[0, b], qvel0 + dv[0, b])
        ref.rollout(ctrl)
        losses.append(float((ref.qpos_now[0] * wq[0]).sum() + (ref.qvel_now[0] * wv[0]).sum()))
        grads.append(ref.backward({ref.substep: wq}, {ref.substep: wv}))
    assert np.std(losses) > 1e-6  # the copies differ: the check is not trivial
    assert bundled_loss == pytest.approx(np.mean(losses), abs=1e-9)
    for name in ("qpos", "qvel", "ctrl"):
        env0 = (slice(None), slice(0, 1)) if name == "ctrl" else (slice(0, 1),)  # ctrl is (steps, envs, 29)
        mean = np.mean([getattr(g, name)[env0] for g in grads], axis=0)
        np.testing.assert_allclose(getattr(gb, name)[env0], mean, rtol=1e-8, atol=1e-9, err_msg=name)
    # the copies' parameter gradients are handed back to their environment
    for name in ("body_mass", "kp", "dof_armature"):
        mean = np.mean([g.params[name][:1] for g in grads], axis=0)
        assert np.abs(mean).max() > 1e-6, name
        np.testing.assert_allclose(gb.params[name][:1], mean, rtol=1e-8, atol=1e-9, err_msg=name)


def test_rows_spread_over_two_threads_give_the_serial_results(standing):
    """``SimConfig.cpu_threads=2`` spreads the loops over the rows (environments and bundle copies)
    over two of Taichi's threads, each with its own block of rows. The forward and reverse pass, with
    bundles open, must give what the serial loops give: a row written by both threads, or a partial
    summed across rows without care, would show here."""
    import bcg.sim as bs
    from bcg.g1sim import make_g1
    from tests.g1_sims import ENVS, MAX_STEPS

    qpos0, qvel0 = standing
    cfg = bs.BundleConfig(size=3, horizon=2, threshold=0.0, seed=5)
    rng = np.random.default_rng(9)
    qvel0 = qvel0 + rng.normal(0.0, 0.1, qvel0.shape)
    ctrl = g1.DEFAULT_JOINT_POS[None, None] + rng.uniform(-0.1, 0.1, (5, ENVS, 29))
    wq, wv = rng.normal(size=(ENVS, 36)), rng.normal(size=(ENVS, 35))
    spread = make_g1(
        ENVS, max_steps=MAX_STEPS, contact=bs.ContactConfig(kappa=300.0), bundle=cfg, cpu_threads=2
    )
    if spread._row_tasks < 2:
        pytest.skip("Taichi's CPU pool has a single thread here: there is nothing to spread")
    results = []
    for sim in (make(bundle=cfg), spread):
        sim.set_bundle_config(cfg)
        sim.set_state(qpos0, qvel0)
        sim.rollout(ctrl)
        assert sim.bundle_stats()["triggers"] >= ENVS
        g = sim.backward({sim.substep: wq}, {sim.substep: wv})
        results.append((sim.qpos_now.copy(), sim.qvel_now.copy(), g))
    (q1, v1, g1_), (q2, v2, g2) = results
    assert np.abs(q1 - qpos0).max() > 1e-3  # the robot moved
    np.testing.assert_allclose(q2, q1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(v2, v1, rtol=1e-12, atol=1e-12)
    for name in ("qpos", "qvel", "ctrl"):
        a, b = getattr(g1_, name), getattr(g2, name)
        assert np.abs(a).max() > 1e-6, name
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=name)
    for name in ("body_mass", "kp", "dof_armature"):
        np.testing.assert_allclose(g2.params[name], g1_.params[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_held_environments_keep_their_state_and_pass_the_gradient_straight_through(standing):
    import bcg.sim as bs

    qpos0, qvel0 = standing
    rng = np.random.default_rng(5)
    n = len(qpos0)  # the shared simulator's environments, standing alike
    q0 = qpos0.copy()
    v0 = qvel0 + rng.normal(scale=0.05, size=(n, 35))
    ctrl = g1.DEFAULT_JOINT_POS[None, None] + rng.uniform(-0.05, 0.05, (3, n, 29))
    hold = np.zeros((3, n), bool)
    hold[:, 1] = True  # held over the whole window
    hold[1, 4] = True  # held in the middle step only
    wq, wv = rng.normal(size=(n, 36)), rng.normal(size=(n, 35))
    wq[:, 3:7] = 0.0

    def run(v_init, holds):
        sim = make()
        sim.set_state(q0, v_init)
        mid = []
        for k in range(3):
            sim.step(ctrl[k], hold=None if holds is None else holds[k])
            mid.append((sim.qpos_now.copy(), sim.qvel_now.copy()))
        loss = (sim.qpos_now * wq).sum(axis=1) + (sim.qvel_now * wv).sum(axis=1)
        return sim, mid, loss

    sim, mid, loss = run(v0, hold)
    grads = sim.backward({sim.substep: wq}, {sim.substep: wv})
    _, mid_free, loss_free = run(v0, None)
    # a held environment stays put in its held steps, and only there
    np.testing.assert_array_equal(mid[2][0][1], q0[1])
    np.testing.assert_array_equal(mid[2][1][1], v0[1])
    np.testing.assert_array_equal(mid[1][0][4], mid[0][0][4])
    assert np.abs(mid[2][0][4] - mid[1][0][4]).max() > 1e-6
    # the other environments run exactly as without holding
    others = [0, 2, 3, 5]
    np.testing.assert_allclose(loss[others], loss_free[others], rtol=0, atol=1e-12)
    assert np.abs(mid[0][0][4] - mid_free[0][0][4]).max() == 0.0  # env 4 is stepped before its hold
    # the gradient goes straight through a hold: identity for env 1, no control gradient
    np.testing.assert_allclose(grads.qpos[1], wq[1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(grads.qvel[1], wv[1], rtol=0, atol=1e-12)
    assert np.all(grads.ctrl[:, 1] == 0) and np.all(grads.ctrl[1, 4] == 0)
    # env 4 (stepped, held, stepped) against central differences of its initial velocity
    for i in (2, 8, 20):
        fd = central_difference(lambda v: run(v, hold)[2][4], v0, (4, i))
        assert grads.qvel[4, i] == pytest.approx(fd, rel=1e-4, abs=1e-8), i
    # held environments open no bundle and do not count as simulated env-steps
    sim = make(bundle=bs.BundleConfig(size=3, threshold=0.0, seed=2))
    sim.set_state(q0, v0)
    for k in range(3):
        sim.step(ctrl[k], hold=hold[k])
        assert 1 not in {b["env"] for b in sim._bundles}
    stats = sim.bundle_stats()
    # the first step bundles every stepped env (4 of 6 in the middle step are already in a bundle)
    assert stats["env_steps"] == stats["triggers"] and 0 < stats["env_steps"] < 3 * n - hold.sum()
    with pytest.raises(ValueError, match="hold must be"):
        sim.step(ctrl[0], hold=np.zeros(n - 1, bool))


def test_bundle_settings_change_in_place_but_not_the_rows(standing):
    import bcg.sim as bs

    sim = make(bundle=bs.BundleConfig(size=3, seed=4, threshold=10.0))
    assert sim.bundle.threshold == 10.0 and sim.bundle.seed == 4
    first = sim._rng.random()
    sim.set_bundle_config(bs.BundleConfig(size=3, seed=4, horizon=1))
    assert sim.bundle.horizon == 1 and sim._rng.random() == first  # the generator restarts from the seed
    with pytest.raises(ValueError, match="cannot change size 2"):
        sim.set_bundle_config(bs.BundleConfig(size=2))
    with pytest.raises(ValueError, match="max_bundles 5"):
        sim.set_bundle_config(bs.BundleConfig(size=3, max_bundles=5))
    with pytest.raises(TypeError, match="expected a BundleConfig"):
        sim.set_bundle_config({"size": 3})


def test_bundle_draws_are_spread_as_configured():
    import bcg.sim as bs
    from bcg.sim.bundle import standard_draws

    b, d = 10, 12
    z = standard_draws(np.random.default_rng(0), b, d, "gaussian")
    assert z.shape == (b, d)
    np.testing.assert_array_equal(z, np.random.default_rng(0).standard_normal((b, d)))
    z = standard_draws(np.random.default_rng(0), b, d, "antithetic")
    np.testing.assert_array_equal(z[b // 2 :], -z[: b // 2])
    assert np.abs(z.mean(axis=0)).max() < 1e-15 and np.abs(z).min() > 0
    z = standard_draws(np.random.default_rng(0), b, d, "latin")
    # one draw in each of the b equally likely strata of every coordinate
    strata = np.floor(special.ndtr(z) * b).astype(int)
    for col in strata.T:
        assert sorted(col) == list(range(b))
    # over many bundles each coordinate is standard normal
    many = np.concatenate([standard_draws(np.random.default_rng(i), b, 3, "latin") for i in range(400)])
    assert abs(many.mean()) < 0.05 and abs(many.std() - 1.0) < 0.05
    assert stats.kstest(many[:, 0], "norm").pvalue > 1e-3
    with pytest.raises(ValueError, match="even"):
        bs.BundleConfig(size=3, sampling="antithetic")
    with pytest.raises(ValueError, match="sampling"):
        bs.BundleConfig(sampling="sobol")


def test_phase_copies_are_the_state_moved_along_its_motion_over_one_step():
    """ "phase" sampling: copy k is the state dt_k later in free flight, the dt_k evenly spaced over
    one physics step with one random offset per bundle; a state at rest keeps its configuration."""
    import bcg.sim as bs
    from bcg.sim.bundle import perturbations, phase_offsets

    mj = g1.load_model(floor=False, collisions="none")
    rng = np.random.default_rng(2)
    qpos = np.stack([g1.default_qpos(mj)] * 2)
    qvel = rng.normal(0.0, 0.5, (2, mj.nv))
    qvel[1] = 0.0
    dt, b = 0.005, 5
    cfg = bs.BundleConfig(size=b, sampling="phase")
    dq, dv = perturbations(mj, qpos, [], cfg, np.random.default_rng(4), qvel, dt)
    draws = np.random.default_rng(4)
    t = phase_offsets(draws.random(), b, dt)  # one offset per state, drawn in turn
    t1 = phase_offsets(draws.random(), b, dt)
    np.testing.assert_allclose(np.diff(t), dt / b, rtol=1e-12)
    assert -dt / 2 <= t.min() and t.max() < dt / 2
    for k in range(b):
        q = qpos[0].copy()
        mujoco.mj_integratePos(mj, q, qvel[0], t[k])
        np.testing.assert_allclose(qpos[0] + dq[0, k], q, rtol=0, atol=1e-15)
        np.testing.assert_allclose(dv[0, k, :3], mj.opt.gravity * t[k], rtol=0, atol=1e-15)
        np.testing.assert_array_equal(dv[0, k, 3:], 0.0)
    # the pelvis moves by its velocity times the offset
    np.testing.assert_allclose(dq[0, :, :3], t[:, None] * qvel[0, :3], rtol=1e-12)
    assert np.abs(dq[1]).max() == 0.0  # at rest: the configuration does not move
    np.testing.assert_allclose(dv[1, :, :3], mj.opt.gravity * t1[:, None], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="velocities"):
        perturbations(mj, qpos, [], cfg, np.random.default_rng(4))
    from bcg.sim.bundle import standard_draws

    with pytest.raises(ValueError, match="no task-space noise"):
        standard_draws(np.random.default_rng(0), b, 3, "phase")


def energy(mj, data, qpos, qvel, target):
    data.qpos[:], data.qvel[:] = qpos, qvel
    mujoco.mj_forward(mj, data)
    q = qpos[g1.joint_qpos_adr(mj)]
    return data.energy[0] + data.energy[1] + 0.5 * np.sum(g1.KP * (q - target) ** 2)


@pytest.mark.parametrize("depth_correction", [0.0, 0.2])
@pytest.mark.parametrize("kappa", KAPPAS)
def test_drop_settles_without_energy_gain(ti64, kappa, depth_correction):
    """The standing G1 dropped from 5 cm: no energy gain, no explosion (with and without the
    position term, which pushes a sphere out at beta d / h)."""
    sim = make(kappa=kappa, depth_correction=depth_correction)
    mj = g1.load_model(floor=False, collisions="none")
    mj.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    data = mujoco.MjData(mj)
    q = g1.default_qpos(mj)[None].copy()
    q[:, 2] += 0.05
    sim.set_state(q, 0.0)
    e0 = energy(mj, data, q[0], np.zeros(35), g1.DEFAULT_JOINT_POS)
    worst, touched = -np.inf, False
    for _ in range(40):  # 0.8 s: the drop, the impact and the settling
        sim.step(g1.DEFAULT_JOINT_POS[None])
        qp, qv = sim.qpos_now[0], sim.qvel_now[0]
        assert np.all(np.isfinite(qp)) and np.abs(qv).max() < 20.0
        worst = max(worst, energy(mj, data, qp, qv, g1.DEFAULT_JOINT_POS) - e0)
        touched |= sim.contact_force().sum() > 100.0
    assert touched
    assert worst < 0.5, f"energy gained {worst:.3f} J"
    assert sim.penetration().max() < 0.1  # the feet are held by the ground


def slope_box(mu, tan_angle, kappa=300.0):
    import bcg.sim as bs

    xml = """<mujoco><worldbody><body name="box" pos="0 0 0.05"><freejoint/>
      <inertial pos="0 0 0" mass="2" diaginertia="0.01 0.01 0.01"/></body></worldbody></mujoco>"""
    corners = tuple(("box", (x, y, -0.04)) for x in (-0.1, 0.1) for y in (-0.1, 0.1))
    contact = bs.ContactConfig(kappa=kappa, friction=mu, spheres=corners, radius=0.01)
    sim = bs.Simulator(xml, bs.SimConfig(num_envs=1, max_steps=50, requires_grad=False), contact=contact)
    angle = np.arctan(tan_angle)
    sim.set_gravity([9.81 * np.sin(angle), 0.0, -9.81 * np.cos(angle)])
    q = np.array([[0, 0, 0.0495, 1, 0, 0, 0]], dtype=float)
    sim.set_state(q, 0.0)
    sim.rollout(np.zeros((10, 1, 1)))  # settle
    x0 = sim.qpos_now[0, 0]
    sim.reset_window()
    sim.rollout(np.zeros((50, 1, 1)))  # 1 s
    return sim.qpos_now[0, 0] - x0


def test_block_on_slope_sticks_below_and_slides_above_the_friction_cone(ti64):
    mu = 0.5
    assert abs(slope_box(mu, 0.4)) < 0.01  # tan(angle) < mu: sticks
    assert slope_box(mu, 0.6) > 0.1  # tan(angle) > mu: slides down the slope (+x)


def test_standing_penetration_close_to_mujoco(ti64):
    """Mean foot penetration of the standing G1 at kappa = 300 against MuJoCo's on the same scene
    (feet-only collision, same PD and integrator): deeper, by less than 15 mm."""
    from bcg.studies.penetration import bcg_depths, mujoco_depths

    ours = bcg_depths(make(), 300.0, 0.5, 0.0)
    theirs = mujoco_depths(0.5, 0.0)
    assert theirs.max() > 0.0 and ours.max() < 0.03
    gap_mm = 1000 * (ours.mean() - theirs.mean())
    assert 0.0 <= gap_mm < 15.0, gap_mm


def test_position_term_keeps_penetration_within_the_papers_gaps_to_mujoco(ti64):
    """With ``depth_correction`` = 0.2 the standing G1's mean foot penetration stays within the
    paper's gaps to MuJoCo (2.9 mm at kappa = 300, 13.5 mm at kappa = 50), and the term does what it
    is for: without it the feet sink deeper at both stiffnesses."""
    from bcg.studies.penetration import bcg_depths, mujoco_depths

    theirs = 1000 * mujoco_depths(0.5, 0.0).mean()
    for kappa, paper_gap in ((300.0, 2.9), (50.0, 13.5)):
        plain = 1000 * bcg_depths(make(kappa), kappa, 0.5, 0.0).mean()
        ours = 1000 * bcg_depths(make(kappa, depth_correction=0.2), kappa, 0.5, 0.0).mean()
        assert 0.0 <= ours - theirs < paper_gap, (kappa, ours, theirs)
        assert plain - theirs > paper_gap and ours < 0.5 * plain, (kappa, plain, ours)
    make(300.0, depth_correction=0.0)


def test_contact_settings_change_in_place_and_refuse_what_sizes_the_kernels(ti64):
    sim = make(300.0, depth_correction=0.1)
    assert sim.ground.con_dcorr[None] == pytest.approx(0.1) and sim.contact.depth_correction == 0.1
    sim.set_contact(ground_height=0.01, activation_margin=0.0)
    assert sim.ground.con_ground[None] == pytest.approx(0.01) and sim.ground.con_margin[None] == 0.0
    with pytest.raises(ValueError, match="depth_correction"):
        sim.set_contact(depth_correction=1.2)
    with pytest.raises(ValueError, match="not radius"):
        sim.set_contact(radius=0.05)
    sim.set_contact(ground_height=0.0, activation_margin=None, depth_correction=0.0)
    assert sim.ground.con_margin[None] == pytest.approx(4.6 / 300.0)


FLOAT32_SCRIPT = """
import numpy as np, bcg.sim as bs
from bcg.core import g1
from bcg.g1sim import make_g1
bs.init(precision="float32")
sim = make_g1(2, max_steps=1, contact=bs.ContactConfig(kappa=300.0))
q = np.tile(g1.default_qpos(sim.mjmodel), (2, 1))
q[1, 2] += 0.6          # env 1 far above the ground: kappa * depth far below -100
sim.set_state(q, 0.0)
sim.step(np.tile(g1.DEFAULT_JOINT_POS, (2, 1)))
g = sim.backward({1 * sim.substep: np.ones((2, sim.nq))}, {sim.substep: np.ones((2, sim.nv))})
assert np.isfinite(g.qpos).all() and np.isfinite(g.qvel).all(), "non-finite gradient"
print("finite")
"""


@pytest.mark.slow
def test_float32_gradients_stay_finite_with_spheres_far_above_the_ground(tmp_path):
    """The smoothing's exponent is clamped so that its derivative cannot overflow in float32."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "f32.py"
    script.write_text(FLOAT32_SCRIPT)
    env = dict(os.environ, TI_SKIP_VERSION_CHECK="ON", PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=root, timeout=1800
    )
    assert out.returncode == 0 and "finite" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("at", ["bodies", "spheres"])
def test_perturbations_land_at_the_configured_points(at):
    """J+ maps the task-space draws to joint space, with J the stacked translational Jacobian of the
    foot bodies' origins or of every contact sphere's centre (checked against finite differences of
    the points' positions)."""
    import mujoco

    import bcg.sim as bs
    from bcg.sim.bundle import perturbations

    mj = g1.load_model()
    qpos = g1.default_qpos(mj)
    qpos[7:] += np.random.default_rng(0).uniform(-0.2, 0.2, mj.nq - 7)  # a generic pose
    feet = list(dict.fromkeys(b for b, _ in g1.FOOT_SPHERES))
    if at == "bodies":
        points = [(mj.body(b).id, np.zeros(3)) for b in feet]
        arg = [mj.body(b).id for b in feet]
    else:
        points = [(mj.body(b).id, np.array(o)) for b, o in g1.FOOT_SPHERES]
        arg = points
    cfg = bs.BundleConfig(size=3, perturb_at=at)
    dq, dv = perturbations(mj, qpos[None], arg, cfg, np.random.default_rng(5))

    data = mujoco.MjData(mj)

    def where(q):
        data.qpos[:] = q
        mujoco.mj_kinematics(mj, data)
        return np.concatenate([data.xpos[b] + data.xmat[b].reshape(3, 3) @ o for b, o in points])

    eps, jac = 1e-6, np.zeros((3 * len(points), mj.nv))
    for i in range(mj.nv):
        step = np.zeros(mj.nv)
        step[i] = eps
        qp, qm = qpos.copy(), qpos.copy()
        mujoco.mj_integratePos(mj, qp, step, 1.0)
        mujoco.mj_integratePos(mj, qm, -step, 1.0)
        jac[:, i] = (where(qp) - where(qm)) / (2 * eps)
    m = jac.shape[0]
    rng = np.random.default_rng(5)  # the draws perturbations() took, in its order
    dx, dxd = rng.normal(0.0, cfg.sigma_pos, (3, m)), rng.normal(0.0, cfg.sigma_vel, (3, m))
    pinv = jac.T @ np.linalg.inv(jac @ jac.T + cfg.jacobian_damping * np.eye(m))
    np.testing.assert_allclose(dv[0], dxd @ pinv.T, rtol=1e-5, atol=1e-8)
    assert np.abs(dv[0]).max() > 1e-3
    # the positions: joint offsets equal J+ dx (hinges add; the free joint integrates on the manifold)
    np.testing.assert_allclose(dq[0][:, 7:], (dx @ pinv.T)[:, 6:], rtol=1e-5, atol=1e-8)


def test_kinematics_vjp_matches_finite_differences_and_keeps_no_seed_between_calls(ti64):
    """``kinematics_vjp`` (the environments' body-position and -orientation losses carried into the
    reverse pass) against central differences of ``kinematics``, each environment at its own pose;
    a call without an orientation seed after one with must not reuse the earlier seed."""
    sim = make()
    rng = np.random.default_rng(4)
    n = sim.num_envs
    q = np.repeat(g1.default_qpos(sim.mjmodel)[None], n, axis=0)
    q[:, 7:] += rng.uniform(-0.3, 0.3, (n, sim.nq - 7))
    quat = rng.standard_normal((n, 4))
    q[:, 3:7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    g_pos = rng.standard_normal((n, sim.nbody, 3))
    g_quat = rng.standard_normal((n, sim.nbody, 4))

    def loss(qpos, with_quat):
        xpos, xquat = sim.kinematics(qpos)
        return np.sum(g_pos * xpos, axis=(1, 2)) + (np.sum(g_quat * xquat, axis=(1, 2)) if with_quat else 0)

    for with_quat in (True, False):
        grad = sim.kinematics_vjp(q, g_pos, g_quat if with_quat else None)
        for i in (2, 4, 9, 20, sim.nq - 1):  # height, quaternion, leg and arm joints
            fd = central_difference(lambda x, w=with_quat: loss(x, w), q, (slice(None), i))
            np.testing.assert_allclose(grad[:, i], fd, rtol=1e-6, atol=1e-8, err_msg=f"qpos[{i}]")
