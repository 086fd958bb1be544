"""Bundled contact gradients (BCG): at a stiff contact, simulate perturbed copies and average them.

When an environment's largest per-sphere contact force over a control step exceeds ``threshold``
(400 N), the step is rolled back for that environment alone and ``size`` (B = 10) copies are started
from its pre-step state, each perturbed without gradient by task-space noise at the perturbation
bodies (the feet): dx ~ N(0, sigma_pos^2 I), dxdot ~ N(0, sigma_vel^2 I), mapped to joint space by the
damped pseudoinverse J^+ = J^T (J J^T + lambda_J I)^-1 of their stacked translational Jacobians
(detached, from MuJoCo at the pre-step state). The copies are simulated for ``horizon`` (H = 2) control
steps; after each control step the environment's state is the arithmetic mean of the copies
(quaternions sign-aligned to the first copy and renormalised), which is what the learner observes and
where the rollout continues after the bundle closes. Each copy keeps its own state through the bundle;
the PD targets of the second step are the ones the policy computes from the mean state, shared by
all copies. Because the mean is linear and the noise carries no gradient, the reverse pass through the
copies gives exactly the mean of the per-copy gradients, the bundled Jacobian of the H-step map.

Only triggered environments pay: copies live in a pool of extra simulator rows, and every kernel runs
over the active rows alone. A triggered environment does not trigger again inside its bundle.
"""

from dataclasses import dataclass, replace

import mujoco
import numpy as np
import taichi as ti
from scipy import special
from scipy.stats import qmc

from bcg.sim.model import JNT_BALL, JNT_FREE
from bcg.sim.rows import padded
from bcg.sim.spatial import quat_normalize
from bcg.sim.tape import BranchInit, Collapse, CtrlCopy, Substep


@dataclass(frozen=True)
class BundleConfig:
    """Bundled contact gradient settings (defaults: the paper's).

    Attributes:
        threshold: N, per-sphere contact force above which an environment's step is bundled.
        size: B, copies per bundle.
        horizon: H, control steps a bundle lasts.
        sigma_pos: m, std of the task-space position perturbation of each perturbation body.
        sigma_vel: m/s, std of its velocity perturbation.
        jacobian_damping: lambda_J of the damped pseudoinverse.
        perturb_bodies: bodies whose positions are perturbed; None = the bodies carrying contact
            spheres.
        perturb_at: where the task-space draws land [R]. "bodies" (default, our reading of the
            paper): the origins of ``perturb_bodies`` (the two ankle-roll frames on the G1), so each
            foot moves as a whole and its spheres keep their heights relative to each other.
            "spheres": the centre of every contact sphere (8 points on the G1, 24 coordinates), each
            drawn independently; the damped pseudoinverse fits the joint motion that comes closest,
            which tilts the feet as well as moving them, so the spheres of a foot reach the ground at
            different times in different copies.
        max_bundles: bundles open at once (memory: B rows each); None = one per environment.
        seed: seed of the perturbation noise.
        enabled: False keeps contact stiff with plain gradients (the trigger rate is still counted).
        trigger_fraction: for benchmarks and tests only: bundle this fraction of the environment-steps
            at random instead of thresholding the contact force; None (default) uses the threshold.
        common_noise: False (default, the paper's): every bundle draws its own perturbations from the
            simulator's noise stream. True: common random numbers, every environment bundled at the
            same control step gets the same task-space draws (a generator seeded by (seed, number
            of set_state calls, control steps since), mapped through each environment's own
            Jacobian), so the bundled gradients of nearby states differ by their states only. The
            Monte-Carlo error is then shared, not removed: it no longer shows in the spread between
            environments, and averaging over environments no longer reduces it.
        sampling: how a bundle's B task-space draws are spread [R]. "gaussian" (default, the paper's):
            independent normal draws. "antithetic": B/2 normal draws and their negatives (B even), so
            the draws' mean is exactly zero and any part of a copy's response that is odd in the
            perturbation cancels in the average. "latin": a Latin hypercube (scipy.stats.qmc) mapped
            through the normal quantile function: in every task-space coordinate the B draws fall one
            in each of B equally likely strata, which removes most of the Monte-Carlo error of the
            parts of the response that are additive in the coordinates. "phase" (ours): no task-space
            draw; copy k is the pre-step state moved along its own motion by the time offset
            dt_k = ((k + u) / B - 1/2) dt, one random u ~ U(0, 1) per bundle, dt the physics step:
            the configuration integrated along the velocity for dt_k and each free joint's linear
            velocity changed by gravity * dt_k (the state dt_k later in free flight). The B copies
            meet a touchdown at B evenly spaced points of the substep grid, which is what makes a
            stiff contact's gradient jump from one substep to the next, so their mean removes that
            jump to within 1/B of its size (the least any B equally weighted copies can leave,
            against 1/sqrt(B) for independent draws); a copy differs from the state by at most half a
            step of its motion, so the bundle adds far less noise than 1 cm draws where nothing
            touches down.
            ``sigma_pos``, ``sigma_vel`` and ``perturb_at`` do not apply (see docs/gradient_study.md).
    """

    threshold: float = 400.0
    size: int = 10
    horizon: int = 2
    sigma_pos: float = 0.01
    sigma_vel: float = 0.02
    jacobian_damping: float = 1e-4
    perturb_bodies: tuple | None = None
    max_bundles: int | None = None
    seed: int = 0
    enabled: bool = True
    trigger_fraction: float | None = None
    common_noise: bool = False
    sampling: str = "gaussian"
    perturb_at: str = "bodies"

    def __post_init__(self):
        if self.perturb_at not in PERTURB_AT:
            raise ValueError(
                f"BundleConfig.perturb_at: {self.perturb_at!r} is not one of {', '.join(PERTURB_AT)}"
            )
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"BundleConfig.sampling: {self.sampling!r} is not one of {', '.join(SAMPLINGS)}")
        if self.sampling == "antithetic" and self.size % 2:
            raise ValueError(f"BundleConfig: antithetic sampling needs an even bundle size, got {self.size}")


SAMPLINGS = ("gaussian", "antithetic", "latin", "phase")
PERTURB_AT = ("bodies", "spheres")


def standard_draws(rng: np.random.Generator, b: int, d: int, sampling: str) -> np.ndarray:
    """(b, d) draws whose coordinates are each standard normal, spread as ``sampling`` says (see
    :attr:`BundleConfig.sampling`)."""
    if sampling == "phase":
        raise ValueError("phase sampling draws no task-space noise: its copies come from phase_offsets")
    if sampling == "gaussian":
        return rng.standard_normal((b, d))
    if sampling == "antithetic":
        half = rng.standard_normal((b // 2, d))
        return np.concatenate([half, -half])
    if sampling == "latin":
        u = qmc.LatinHypercube(d=d, rng=rng).random(b)
        return special.ndtri(u)
    raise ValueError(f"unknown sampling {sampling!r}; expected one of {', '.join(SAMPLINGS)}")


def phase_offsets(u: float, b: int, dt: float) -> np.ndarray:
    """The time offsets of "phase" sampling: ((k + u) / b - 1/2) dt for k = 0 .. b - 1."""
    return ((np.arange(b) + u) / b - 0.5) * dt


def perturbations(
    mj: mujoco.MjModel,
    qpos: np.ndarray,
    bodies,
    cfg: BundleConfig,
    rng: np.random.Generator,
    qvel: np.ndarray | None = None,
    dt: float | None = None,
):
    """Joint-space perturbations of B copies of each state.

    Args:
        mj: compiled model.
        qpos: (K, nq) pre-step configurations.
        bodies: the points perturbed in task space: body ids (their origins), or (body id, (x, y, z)
            in the body frame) pairs.
        cfg: the bundle settings.
        rng: noise source (no gradient flows through the noise): one generator for all states, or a
            sequence of K generators, one per state.
        qvel: (K, nv) pre-step velocities, and dt the physics step: needed by "phase" sampling.

    Returns:
        dqpos (K, B, nq) offsets such that qpos + dqpos = qpos (+) J^+ dx (integrated on the manifold),
        and dqvel (K, B, nv) = J^+ dxdot; with "phase" sampling qpos + dqpos = qpos (+) dt_k qvel and
        dqvel = gravity * dt_k on each free joint's linear velocity.
    """
    k, b = len(qpos), cfg.size
    dq = np.zeros((k, b, mj.nq))
    dv = np.zeros((k, b, mj.nv))
    rngs = list(rng) if isinstance(rng, (list, tuple)) else [rng] * k
    if len(rngs) != k:
        raise ValueError(f"perturbations: {len(rngs)} generators for {k} states")
    if cfg.sampling == "phase":
        if qvel is None or dt is None:
            raise ValueError(
                "perturbations: phase sampling needs the states' velocities and the physics step"
            )
        free = [mj.jnt_dofadr[j] for j in range(mj.njnt) if mj.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        for n in range(k):
            for i, t in enumerate(phase_offsets(rngs[n].random(), b, dt)):
                q = qpos[n].copy()
                mujoco.mj_integratePos(mj, q, qvel[n], t)
                dq[n, i] = q - qpos[n]
                for a in free:
                    dv[n, i, a : a + 3] = mj.opt.gravity * t
        return dq, dv
    data = mujoco.MjData(mj)
    jacp = np.zeros((3, mj.nv))
    points = [
        (int(p[0]), np.asarray(p[1], float)) if isinstance(p, (tuple, list)) else (int(p), None)
        for p in bodies
    ]
    m = 3 * len(points)
    for n in range(k):
        data.qpos[:] = qpos[n]
        mujoco.mj_kinematics(mj, data)
        mujoco.mj_comPos(mj, data)
        rows = []
        for body, offset in points:
            if offset is None:
                mujoco.mj_jacBody(mj, data, jacp, None, body)
            else:
                point = data.xpos[body] + data.xmat[body].reshape(3, 3) @ offset
                mujoco.mj_jac(mj, data, jacp, None, point, body)
            rows.append(jacp.copy())
        jac = np.vstack(rows)
        pinv = jac.T @ np.linalg.inv(jac @ jac.T + cfg.jacobian_damping * np.eye(m))
        if cfg.sampling == "gaussian":  # the original draw order: same stream, same numbers
            dx = rngs[n].normal(0.0, cfg.sigma_pos, (b, m))
            dxd = rngs[n].normal(0.0, cfg.sigma_vel, (b, m))
        else:  # positions and velocities stratified jointly
            z = standard_draws(rngs[n], b, 2 * m, cfg.sampling)
            dx, dxd = cfg.sigma_pos * z[:, :m], cfg.sigma_vel * z[:, m:]
        for i in range(b):
            q = qpos[n].copy()
            mujoco.mj_integratePos(mj, q, pinv @ dx[i], 1.0)
            dq[n, i] = q - qpos[n]
            dv[n, i] = pinv @ dxd[i]
    return dq, dv


class BundleKernels:
    """Copy-in and averaging kernels of the bundle rows (differentiable), and the bundle settings."""

    # Bookkeeping of the bundle rows: a few hundred numbers per call, run on the calling thread
    # (``_serial``: on a CPU a parallel loop costs a thread-pool round trip, far more than the copies
    # themselves). One launch each, instead of a ``from_numpy`` per field.
    @ti.kernel
    def _load_pairs(self, src: ti.types.ndarray(), dst: ti.types.ndarray(), n: ti.i32):
        ti.loop_config(serialize=self._serial)
        for k in range(n):
            self.bundle_rows.branch_src[k] = src[k]
            self.bundle_rows.branch_dst[k] = dst[k]
        self.bundle_rows.n_branch[None] = n

    @ti.kernel
    def _load_noise(self, dq: ti.types.ndarray(), dv: ti.types.ndarray(), n: ti.i32):
        ti.loop_config(serialize=self._serial)
        for k in range(n):
            for i in range(self.nq):
                self.bundle_rows.branch_dq[k, i] = dq[k, i]
            for i in range(self.nv):
                self.bundle_rows.branch_dv[k, i] = dv[k, i]

    @ti.kernel
    def _load_collapse(self, mains: ti.types.ndarray(), firsts: ti.types.ndarray(), n: ti.i32):
        ti.loop_config(serialize=self._serial)
        for g in range(n):
            self.bundle_rows.collapse_main[g] = mains[g]
            self.bundle_rows.collapse_first[g] = firsts[g]
        self.bundle_rows.n_collapse[None] = n

    @ti.func
    def _copy_row(self, f: ti.template(), src, dst):
        if ti.static(len(f.shape) == 1):
            f[dst] = f[src]
        else:
            for a in range(f.shape[1]):
                f[dst, a] = f[src, a]

    @ti.kernel
    def _copy_param_rows(self):
        """Each copy (branch_dst) takes its environment's (branch_src) model parameters and friction."""
        ti.loop_config(serialize=self._serial)
        for k in range(self.bundle_rows.n_branch[None]):
            for f in ti.static(self._row_params):
                self._copy_row(f, self.bundle_rows.branch_src[k], self.bundle_rows.branch_dst[k])

    @ti.kernel
    def _return_param_grads(self):
        """A bundle's copies used their environment's parameters: add their parameter gradients to the
        environment's and clear them. Serial: several copies share one environment."""
        ti.loop_config(serialize=True)
        for k in range(self.bundle_rows.n_branch[None]):
            src, dst = self.bundle_rows.branch_src[k], self.bundle_rows.branch_dst[k]
            for f in ti.static(self._grad_params):
                if ti.static(len(f.shape) == 1):
                    f.grad[src] = f.grad[src] + f.grad[dst]
                    f.grad[dst] = f.grad[dst] * 0
                else:
                    for a in range(f.shape[1]):
                        f.grad[src, a] = f.grad[src, a] + f.grad[dst, a]
                        f.grad[dst, a] = f.grad[dst, a] * 0

    @ti.kernel
    def _branch_init(self, s: ti.i32):
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(self.bundle_rows.n_branch[None], self.nq):
            self.state.qpos[s, self.bundle_rows.branch_dst[k], i] = (
                self.state.qpos[s, self.bundle_rows.branch_src[k], i] + self.bundle_rows.branch_dq[k, i]
            )
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(self.bundle_rows.n_branch[None], self.nv):
            self.state.qvel[s, self.bundle_rows.branch_dst[k], i] = (
                self.state.qvel[s, self.bundle_rows.branch_src[k], i] + self.bundle_rows.branch_dv[k, i]
            )

    @ti.kernel
    def _branch_ctrl(self, c: ti.i32):
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(self.bundle_rows.n_branch[None], self.nu):
            self.state.ctrl[c, self.bundle_rows.branch_dst[k], i] = self.state.ctrl[
                c, self.bundle_rows.branch_src[k], i
            ]
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(self.bundle_rows.n_branch[None], self.nv):
            self.state.qfrc_applied[c, self.bundle_rows.branch_dst[k], i] = self.state.qfrc_applied[
                c, self.bundle_rows.branch_src[k], i
            ]

    @ti.kernel
    def _collapse(self, s: ti.i32):
        """State of each bundle's environment = mean of its copies (quaternions sign-aligned)."""
        ti.loop_config(serialize=self._serial)
        for g, j in ti.ndrange(self.bundle_rows.n_collapse[None], self.njnt):
            m = self.bundle_rows.collapse_main[g]
            f = self.bundle_rows.collapse_first[g]
            a = self.mdl.jnt_qposadr[j]
            jt = self.mdl.jnt_type[j]
            if jt == JNT_FREE or jt == JNT_BALL:
                o = ti.select(jt == JNT_FREE, 3, 0)
                q0 = ti.Vector([self.state.qpos[s, f, a + o + i] for i in ti.static(range(4))])
                acc = ti.Vector([0.0, 0.0, 0.0, 0.0])
                for b in ti.static(range(self.bundle_size)):
                    qb = ti.Vector([self.state.qpos[s, f + b, a + o + i] for i in ti.static(range(4))])
                    acc += qb * ti.select(qb.dot(q0) < 0.0, -1.0, 1.0)
                qn = quat_normalize(acc)
                for i in ti.static(range(4)):
                    self.state.qpos[s, m, a + o + i] = qn[i]
                if jt == JNT_FREE:
                    for i in ti.static(range(3)):
                        t = 0.0
                        for b in ti.static(range(self.bundle_size)):
                            t += self.state.qpos[s, f + b, a + i]
                        self.state.qpos[s, m, a + i] = t / self.bundle_size
            else:
                t = 0.0
                for b in ti.static(range(self.bundle_size)):
                    t += self.state.qpos[s, f + b, a]
                self.state.qpos[s, m, a] = t / self.bundle_size
        ti.loop_config(serialize=self._serial)
        for g, d in ti.ndrange(self.bundle_rows.n_collapse[None], self.nv):
            m = self.bundle_rows.collapse_main[g]
            f = self.bundle_rows.collapse_first[g]
            t = 0.0
            for b in ti.static(range(self.bundle_size)):
                t += self.state.qvel[s, f + b, d]
            self.state.qvel[s, m, d] = t / self.bundle_size

    @ti.kernel
    def _clear_collapsed_grad(self, s: ti.i32):
        """After the collapse adjoint the environment's state grad has moved to the copies."""
        ti.loop_config(serialize=self._serial)
        for g, i in ti.ndrange(self.bundle_rows.n_collapse[None], self.nq):
            self.state.qpos.grad[s, self.bundle_rows.collapse_main[g], i] = 0.0
        ti.loop_config(serialize=self._serial)
        for g, i in ti.ndrange(self.bundle_rows.n_collapse[None], self.nv):
            self.state.qvel.grad[s, self.bundle_rows.collapse_main[g], i] = 0.0


class BundleSchedule:
    """Which environments are bundled when: the trigger, the pool of copy rows (a slot of ``size``
    rows per bundle), and the bundle entries of the tape (:mod:`bcg.sim.tape`). A mixin of
    :class:`bcg.sim.rollout.Simulator`; the kernels are :class:`BundleKernels`'.

    A bundle is a dict: ``env`` its environment, ``first`` its first copy row, ``slot`` its slot in
    the pool, ``steps_left`` the control steps it still lasts, ``start`` the substep it started at.
    """

    def _setup_bundles(self, bundle):
        """The pool's size and the perturbation settings (after the contact's: the spheres)."""
        if bundle is not None:
            self.bundle_size = bundle.size
            # an environment holds at most two slots: its open bundle and one still cooling
            self.max_bundles = bundle.max_bundles or 2 * self.num_envs
            bodies = bundle.perturb_bodies or tuple(dict.fromkeys(b for b, _ in self.spheres))
            self._perturb_bodies = [self.model.body_id(b) for b in bodies]
            self._rng = np.random.default_rng(bundle.seed)
        else:
            self.bundle_size, self.max_bundles = 1, 0
        self._noise_window, self._noise_step = -1, 0  # keys of the common-noise draws
        self.pool_rows = self.bundle_size * self.max_bundles if bundle is not None else 0

    def _clear_bundles(self):
        """A new state: no bundle open, every slot free, the next window's common-noise key."""
        self._bundles = []  # open bundles: dict(env, first, steps_left)
        self._closed = []  # bundles closed by the last step
        self._free_slots = list(range(self.max_bundles))
        self._cooling = []  # (slot, substep it closed at) of bundles closed too recently to reuse
        self._noise_window += 1
        self._noise_step = 0

    def _shift_bundles(self, shift: int):
        """The window's substeps moved down by ``shift`` (:meth:`Simulator.reset_window`)."""
        for b in self._bundles:
            b["start"] -= shift
        self._cooling = [(slot, t - shift) for slot, t in self._cooling]

    def _record_bundle_controls(self, c: int) -> np.ndarray:
        """The open bundles' copies take control step c's control; returns their rows."""
        branch_rows = self._bundle_rows(self._bundles)
        if len(self._bundles):
            self._record(CtrlCopy(c, *self._branch_pairs(self._bundles)))
        return branch_rows

    def _record_bundle_means(self, c: int, s: int):
        """Each open bundle's environment takes the mean of its copies at substep s."""
        if len(self._bundles):
            self._record(Collapse(c, s, *self._collapse_lists(self._bundles)))

    def _close_bundles(self):
        """Count down the open bundles after a control step and close those that are done."""
        for b in self._bundles:
            b["steps_left"] -= 1
        # bundles closed by this step: their copies' forces are this step's forces (contact_force)
        self._closed = [b for b in self._bundles if b["steps_left"] <= 0]
        self._bundles = [b for b in self._bundles if b["steps_left"] > 0 or self._release(b)]

    def _release(self, bundle) -> bool:
        """Return a closed bundle's slot. Its rows hold states that the reverse pass recomputes from
        (and the closing mean reads) up to the current substep, so the slot is reusable only by a
        bundle that starts after it."""
        self._cooling.append((bundle["slot"], self._t))
        return False

    def _bundle_rows(self, bundles) -> np.ndarray:
        if not bundles:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate([np.arange(b["first"], b["first"] + self.bundle_size) for b in bundles]).astype(
            np.int32
        )

    def _branch_pairs(self, bundles):
        src = np.repeat([b["env"] for b in bundles], self.bundle_size).astype(np.int32)
        return src, self._bundle_rows(bundles)

    def _collapse_lists(self, bundles):
        return (
            np.array([b["env"] for b in bundles], np.int32),
            np.array([b["first"] for b in bundles], np.int32),
        )

    def _after_contact_step(self, c, s0, nominal, subs):
        """Bundle the environments whose contact force crossed the threshold in this step."""
        fmax = self.ground.con_force_max.to_numpy()
        self._stat_steps += len(nominal)
        if self.bundle is None:
            return
        if self.bundle.trigger_fraction is not None:
            hot = [int(e) for e in nominal if self._rng.random() < self.bundle.trigger_fraction]
        else:
            hot = [int(e) for e in nominal if fmax[e] > self.bundle.threshold]
        self._stat_triggers += len(hot)
        if not self.bundle.enabled or not hot:
            return
        self._free_slots += [slot for slot, t in self._cooling if t < s0]
        self._cooling = [(slot, t) for slot, t in self._cooling if t >= s0]
        take = hot[: len(self._free_slots)]
        self._stat_dropped += len(hot) - len(take)
        if not take:
            return
        new = []
        for e in take:
            slot = self._free_slots.pop()
            first = self.num_envs + slot * self.bundle_size
            new.append(dict(env=e, first=first, slot=slot, steps_left=self.bundle.horizon, start=s0))
        # the triggered environments' nominal substeps are discarded: keep them out of the reverse pass
        # (and only them: the copies of bundles still open in this step stay in)
        taken = set(take)
        for entry in subs:
            entry.grad_rows = np.array([r for r in entry.rows if r not in taken], dtype=np.int32)
        qpos0 = self._read_rows(self.state.qpos, s0)[take].astype(np.float64)
        if self.bundle.common_noise:
            key = [self.bundle.seed, self._noise_window, self._noise_step]
            rng = [np.random.default_rng(key) for _ in take]  # the same draws for every environment
        else:
            rng = self._rng
        points = self._perturb_bodies
        if self.bundle.perturb_at == "spheres":
            points = [(self.model.body_id(b), offset) for b, offset in self.spheres]
        qvel0 = None
        if self.bundle.sampling == "phase":  # the copies move along the state's own motion
            qvel0 = self._read_rows(self.state.qvel, s0)[take].astype(np.float64)
        dq, dv = perturbations(self.mjmodel, qpos0, points, self.bundle, rng, qvel0, self.dt)
        src, dst = self._branch_pairs(new)
        self._record(BranchInit(c, s0, src, dst, dq.reshape(-1, self.nq), dv.reshape(-1, self.nv)))
        self._record(CtrlCopy(c, src, dst))
        rows = self._bundle_rows(new)
        for k in range(self.substeps):
            self._record(Substep(c=c, s=s0 + k, rows=rows, grad_rows=rows))
        self._record(Collapse(c, s0 + self.substeps, *self._collapse_lists(new)))
        for b in new:
            b["steps_left"] -= 1
        self._closed += [b for b in new if b["steps_left"] <= 0]
        self._bundles += [b for b in new if b["steps_left"] > 0 or self._release(b)]

    def _upload_pairs(self, src, dst, dq=None, dv=None):
        n = len(src)
        m = max(n, 1)  # Taichi wants non-empty arrays
        self._load_pairs(padded(src, m, np.int32), padded(dst, m, np.int32), n)
        if dq is not None:
            self._load_noise(padded(dq, m, self.np_fp), padded(dv, m, self.np_fp), n)

    def _upload_collapse(self, mains, firsts):
        n = len(mains)
        m = max(n, 1)
        self._load_collapse(padded(mains, m, np.int32), padded(firsts, m, np.int32), n)

    # settings (plain Python: no recompiling) ---------------------------------------------------
    def set_bundling(self, enabled: bool, common_noise: bool | None = None):
        """Turn bundled contact gradients on or off (the trigger rate is counted either way), and
        optionally switch common random numbers (:attr:`BundleConfig.common_noise`)."""
        if self.bundle is None:
            raise RuntimeError("this simulator was built without a BundleConfig")
        changes = {"enabled": bool(enabled)}
        if common_noise is not None:
            changes["common_noise"] = bool(common_noise)
        self.bundle = replace(self.bundle, **changes)

    def set_bundle_config(self, bundle):
        """Replace the bundle settings in place, without recompiling: threshold, horizon, noise
        scales, damping, seed (the perturbation generator restarts from it, as in a new simulator),
        draw scheme, perturbation points (``perturb_at``), trigger fraction, common noise, enabled.
        The fields that size the simulator's rows (``size``, ``max_bundles``) and ``perturb_bodies``
        must stay as built; open bundles are dropped at the next :meth:`set_state`, so call it
        between windows."""
        if self.bundle is None:
            raise RuntimeError("this simulator was built without a BundleConfig")
        if not isinstance(bundle, BundleConfig):
            raise TypeError(f"set_bundle_config: expected a BundleConfig, got {type(bundle).__name__}")
        fixed = {
            "size": (bundle.size, self.bundle_size),
            "max_bundles": (bundle.max_bundles or 2 * self.num_envs, self.max_bundles),
            "perturb_bodies": (bundle.perturb_bodies, self.bundle.perturb_bodies),
        }
        changed = [f"{k} {new!r} (built with {old!r})" for k, (new, old) in fixed.items() if new != old]
        if changed:
            raise ValueError(
                "set_bundle_config cannot change " + ", ".join(changed) + ": build a new simulator"
            )
        self.bundle = bundle
        self._rng = np.random.default_rng(bundle.seed)
