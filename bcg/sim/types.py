"""The simulator's Taichi fields as named groups: the model, the state, the intermediates of a substep.

After mujoco_warp's ``types.py`` (a static ``Model``, a mutable ``Data``): every field says its unit
and shape. Shapes use ``n`` for the simulator's rows (the ``num_envs`` environments, then the pool of
bundle copies, :mod:`bcg.sim.bundle`), ``S`` for the substep slots of a window (``max_steps *
substeps + 2``: the last is scratch for kinematics queries), ``T`` for its control steps
(``max_steps``), ``nu'`` for ``max(nu, 1)`` (Taichi wants non-empty fields) and ``nc`` for the contact
spheres. A field with a leading ``n`` in :class:`ModelFields` is randomised per environment (a
bundle copy holds its environment's values).

Spatial quantities are world-frame (angular, linear) pairs about a per-row reference point ``p_ref``,
the origin of body 1 (see :mod:`bcg.sim.dynamics`). Rotational dofs have rad, N m, kg m^2; a slide
dof has m, N, kg instead.

The simulator holds each group under one name, and its kernels read every field through it:
``self.mdl`` (:class:`ModelFields`), ``self.state`` (:class:`StateFields`), ``self.dyn``
(:class:`DynamicsFields`), ``self.ground`` (:class:`ContactFields`), ``self.active``
(:class:`RowFields`), ``self.bundle_rows`` (:class:`BundleFields`) and ``self.selfc``
(:class:`SelfContactFields`).

Each group is allocated in one place, in one fixed order: the order fixes the Taichi SNode trees
that the compiled kernels (and their entries in the offline cache) refer to.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import taichi as ti

from bcg.sim.model import Model, dof_ancestor_lists, subtree_lists


class Allocator:
    """Field constructors of one simulator: its float type, and gradients where it has them."""

    def __init__(self, fp, grad: bool):
        self.fp, self.grad = fp, grad

    def v3(self, shape, grad=None):
        return ti.Vector.field(3, self.fp, shape=shape, needs_grad=self.grad if grad is None else grad)

    def sc(self, shape, grad=None):
        return ti.field(self.fp, shape=shape, needs_grad=self.grad if grad is None else grad)

    @staticmethod
    def i32(shape):
        return ti.field(ti.i32, shape=shape)


class _Group:
    """A named group of fields; :meth:`items` lists its Taichi fields by name, in allocation order."""

    def items(self):
        values = [(f.name, getattr(self, f.name)) for f in fields(self)]
        return [(name, v) for name, v in values if v is not None and not isinstance(v, int)]


@dataclass(eq=False)
class ModelFields(_Group):
    """The model on the device: static fields (one value for all rows), then the randomised ones.

    Attributes:
        body_parentid: parent body (nbody,).
        body_jntadr: the body's joint, or -1 (nbody,).
        body_dofadr: the body's first dof, 0 for a body without dofs (nbody,).
        body_dofnum: the body's dofs (nbody,).
        body_pos: m, body frame origin in the parent frame (nbody,) x 3.
        body_quat: body frame rotation in the parent frame, (w, x, y, z) (nbody,) x 4.
        body_iquat: principal inertia frame in the body frame (nbody,) x 4.
        jnt_type: JNT_FREE, JNT_BALL, JNT_SLIDE or JNT_HINGE (njnt,).
        jnt_qposadr, jnt_dofadr: the joint's first qpos and dof (njnt,).
        jnt_axis: unit axis in the body frame (njnt,) x 3.
        jnt_pos: m, joint anchor in the body frame (njnt,) x 3.
        dof_bodyid, dof_jntid, dof_parentid: the dof's body, joint and parent dof (-1: none) (nv,).
        dof_act: the actuator driving the dof, or -1 (nv,).
        dof_sdot: 1, or 0 for a free joint's translational dofs, whose axes do not move with the
            body: the mask of the velocity-product term (nv,).
        qpos0: reference configuration, m, rad or unit quaternion (nq,).
        gravity: m/s^2, () x 3 (differentiable).
        level_bodies: bodies 1.. ordered by depth in the tree (nbody - 1,).
        subtree_start, subtree_items: CSR lists of each body's subtree, itself included
            (nbody + 1,), (sum of subtree sizes,).
        child_start, child_items: CSR lists of each body's children (nbody + 1,), (max(nbody - 1, 1),).
        npairs: the mass matrix's nonzeros below the diagonal and on it (a dof and an ancestor).
        pair_i, pair_j: a dof and one of its ancestor dofs, itself included (npairs,).
        act_dof, act_qadr: each actuated joint's dof and qpos address (nu',).
        effort_limit: N m, the PD torque's limit per actuated joint (nu',).
        body_mass: kg (n, nbody).
        body_ipos: m, centre of mass in the body frame (n, nbody) x 3.
        body_inertia: kg m^2, principal inertia (n, nbody) x 3.
        dof_armature: kg m^2 (n, nv).
        dof_damping: N m s/rad (n, nv).
        dof_frictionloss: N m, scale of the smooth friction loss (n, nv).
        kp: N m/rad, PD stiffness per actuated joint (n, nu').
        kd: N m s/rad, PD damping (n, nu').
    """

    body_parentid: ti.Field
    body_jntadr: ti.Field
    body_dofadr: ti.Field
    body_dofnum: ti.Field
    body_pos: ti.MatrixField
    body_quat: ti.MatrixField
    body_iquat: ti.MatrixField
    jnt_type: ti.Field
    jnt_qposadr: ti.Field
    jnt_dofadr: ti.Field
    jnt_axis: ti.MatrixField
    jnt_pos: ti.MatrixField
    dof_bodyid: ti.Field
    dof_jntid: ti.Field
    dof_act: ti.Field
    dof_parentid: ti.Field
    dof_sdot: ti.Field
    qpos0: ti.Field
    gravity: ti.MatrixField
    level_bodies: ti.Field
    subtree_start: ti.Field
    subtree_items: ti.Field
    child_start: ti.Field
    child_items: ti.Field
    npairs: int
    pair_i: ti.Field
    pair_j: ti.Field
    act_dof: ti.Field
    act_qadr: ti.Field
    effort_limit: ti.Field
    body_mass: ti.Field
    body_ipos: ti.MatrixField
    body_inertia: ti.MatrixField
    dof_armature: ti.Field
    dof_damping: ti.Field
    dof_frictionloss: ti.Field
    kp: ti.Field
    kd: ti.Field

    #: the randomised fields, by name: what ``Simulator.set_params`` sets and the reverse pass returns
    RANDOMISED = (
        "body_mass", "body_ipos", "body_inertia", "dof_armature", "dof_damping", "dof_frictionloss", "kp",
        "kd",
    )  # fmt: skip

    @classmethod
    def allocate(cls, al: Allocator, model: Model, n: int, nu: int) -> ModelFields:
        """The fields for ``n`` rows, the tree's lists uploaded (the rest by ``Simulator``)."""
        nb, nv, nq, nj, i32, v3, sc = model.nbody, model.nv, model.nq, model.njnt, al.i32, al.v3, al.sc
        f = dict(
            body_parentid=i32(nb), body_jntadr=i32(nb), body_dofadr=i32(nb), body_dofnum=i32(nb),
            body_pos=v3(nb, False), body_quat=ti.Vector.field(4, al.fp, shape=nb),
            body_iquat=ti.Vector.field(4, al.fp, shape=nb),
            jnt_type=i32(nj), jnt_qposadr=i32(nj), jnt_dofadr=i32(nj),
            jnt_axis=v3(nj, False), jnt_pos=v3(nj, False),
            dof_bodyid=i32(nv), dof_jntid=i32(nv), dof_act=i32(nv), dof_parentid=i32(nv),
            dof_sdot=sc(nv, False), qpos0=sc(nq, False),
            gravity=ti.Vector.field(3, al.fp, shape=(), needs_grad=al.grad), level_bodies=i32(nb - 1),
        )  # fmt: skip
        sub_start, sub_items = subtree_lists(model)
        anc_start, anc_items = dof_ancestor_lists(model)
        f["subtree_start"], f["subtree_items"] = i32(len(sub_start)), i32(len(sub_items))
        f["subtree_start"].from_numpy(sub_start)
        kids = [[c for c in range(1, nb) if model.body_parentid[c] == b] for b in range(nb)]
        f["child_start"], f["child_items"] = i32(nb + 1), i32(max(nb - 1, 1))
        f["child_start"].from_numpy(np.cumsum([0] + [len(k) for k in kids]).astype(np.int32))
        f["child_items"].from_numpy(np.array(sum(kids, []) or [0], dtype=np.int32))
        f["subtree_items"].from_numpy(sub_items)
        pi = np.repeat(np.arange(nv), np.diff(anc_start)).astype(np.int32)
        f["npairs"] = len(pi)
        f["pair_i"], f["pair_j"] = i32(len(pi)), i32(len(pi))
        f["pair_i"].from_numpy(pi)
        f["pair_j"].from_numpy(anc_items.astype(np.int32))
        f["act_dof"], f["act_qadr"] = i32(nu), i32(nu)
        f["effort_limit"] = sc(nu, False)
        f["body_mass"] = sc((n, nb))
        f["body_ipos"], f["body_inertia"] = v3((n, nb)), v3((n, nb))
        f["dof_armature"], f["dof_damping"], f["dof_frictionloss"] = sc((n, nv)), sc((n, nv)), sc((n, nv))
        f["kp"], f["kd"] = sc((n, nu)), sc((n, nu))
        return cls(**f)

    def randomised(self) -> dict:
        """The randomised fields by name, in :attr:`RANDOMISED` order."""
        return {name: getattr(self, name) for name in self.RANDOMISED}


@dataclass(eq=False)
class StateFields(_Group):
    """The time-indexed state and control: substep s reads slot s and writes slot s + 1, so nothing is
    overwritten inside a window (Taichi's reverse mode needs write-once fields).

    Attributes:
        qpos: joint positions, m, rad and unit quaternions (S, n, nq).
        qvel: joint velocities, m/s and rad/s (S, n, nv).
        ctrl: PD targets of each control step, rad (T, n, nu').
        qfrc_applied: applied joint forces of each control step, N m (T, n, nv).
    """

    qpos: ti.Field
    qvel: ti.Field
    ctrl: ti.Field
    qfrc_applied: ti.Field

    @classmethod
    def allocate(
        cls, al: Allocator, slots: int, steps: int, n: int, nq: int, nv: int, nu: int
    ) -> StateFields:
        qpos, qvel = al.sc((slots, n, nq)), al.sc((slots, n, nv))
        ctrl, qfrc_applied = al.sc((steps, n, nu)), al.sc((steps, n, nv))
        return cls(qpos, qvel, ctrl, qfrc_applied)


@dataclass(eq=False)
class DynamicsFields(_Group):
    """The intermediates of one substep's dynamics, per row, recomputed from the state in every substep
    (the reverse pass recomputes them from the substep's stored input state).

    Attributes:
        xpos: m, body origins in the world (n, nbody) x 3.
        xanchor: m, the body's joint anchor in the world (n, nbody) x 3.
        xaxis: the body's hinge or slide axis in the world, unit (n, nbody) x 3.
        xquat: body orientations in the world, (w, x, y, z) (n, nbody) x 4.
        xmat: the same as rotation matrices (n, nbody) x 3 x 3.
        cdof_ang, cdof_lin: each dof's motion axis about p_ref: unit axis, and m per rad
            (n, nv) x 3 each.
        cvel_ang, cvel_lin: body velocities about p_ref, rad/s, m/s (n, nbody) x 3 each.
        cacc_ang, cacc_lin: body velocity-product accelerations with gravity as the world's
            acceleration, rad/s^2, m/s^2 (n, nbody) x 3 each.
        body_m: kg, body masses (n, nbody).
        body_h: kg m, first moments about p_ref (n, nbody) x 3.
        body_rot_inertia: kg m^2, rotational inertias about p_ref (n, nbody) x 3 x 3.
        crb_m, crb_h, crb_rot_inertia: the same summed over each body's subtree (composite bodies).
        dof_f_ang, dof_f_lin: F_i = I_composite(body(i)) S_i, kg m^2, kg m (n, nv) x 3 each.
        mass: kg m^2, joint-space inertia M with armature (n, nv, nv).
        cfrc_ang, cfrc_lin: each body's inertial force about p_ref, N m, N (n, nbody) x 3 each.
        sub_frc_ang, sub_frc_lin: the same summed over each body's subtree.
        qfrc_bias: N m, Coriolis, centrifugal and gravity forces (n, nv).
        qfrc_total: N m, actuator, applied and passive forces (n, nv).
        qacc: rad/s^2, M^-1 (qfrc_total - qfrc_bias) without contact (n, nv).
        act_force: N m, the clipped PD torque per actuated joint (n, nu').
        chol: sqrt(kg) m, the Cholesky factor L of M = L L^T (n, nv, nv), not differentiated.
        rhs, rhs_bar: N m, the solve's right-hand side and its adjoint's (n, nv), not differentiated.
    """

    xpos: ti.MatrixField
    xanchor: ti.MatrixField
    xaxis: ti.MatrixField
    xquat: ti.MatrixField
    xmat: ti.MatrixField
    cdof_ang: ti.MatrixField
    cdof_lin: ti.MatrixField
    cvel_ang: ti.MatrixField
    cvel_lin: ti.MatrixField
    cacc_ang: ti.MatrixField
    cacc_lin: ti.MatrixField
    body_m: ti.Field
    crb_m: ti.Field
    body_h: ti.MatrixField
    crb_h: ti.MatrixField
    body_rot_inertia: ti.MatrixField
    crb_rot_inertia: ti.MatrixField
    dof_f_ang: ti.MatrixField
    dof_f_lin: ti.MatrixField
    mass: ti.Field
    cfrc_ang: ti.MatrixField
    cfrc_lin: ti.MatrixField
    sub_frc_ang: ti.MatrixField
    sub_frc_lin: ti.MatrixField
    qfrc_bias: ti.Field
    qfrc_total: ti.Field
    qacc: ti.Field
    act_force: ti.Field
    chol: ti.Field
    rhs: ti.Field
    rhs_bar: ti.Field

    @classmethod
    def allocate(cls, al: Allocator, n: int, nbody: int, nv: int, nu: int) -> DynamicsFields:
        v3, sc, nb = al.v3, al.sc, nbody
        f = dict(xpos=v3((n, nb)), xanchor=v3((n, nb)), xaxis=v3((n, nb)))
        f["xquat"] = ti.Vector.field(4, al.fp, shape=(n, nb), needs_grad=al.grad)
        f["xmat"] = ti.Matrix.field(3, 3, al.fp, shape=(n, nb), needs_grad=al.grad)
        f["cdof_ang"], f["cdof_lin"] = v3((n, nv)), v3((n, nv))
        for name in ("cvel_ang", "cvel_lin", "cacc_ang", "cacc_lin"):
            f[name] = v3((n, nb))
        f["body_m"], f["crb_m"] = sc((n, nb)), sc((n, nb))
        f["body_h"], f["crb_h"] = v3((n, nb)), v3((n, nb))
        f["body_rot_inertia"] = ti.Matrix.field(3, 3, al.fp, shape=(n, nb), needs_grad=al.grad)
        f["crb_rot_inertia"] = ti.Matrix.field(3, 3, al.fp, shape=(n, nb), needs_grad=al.grad)
        f["dof_f_ang"], f["dof_f_lin"] = v3((n, nv)), v3((n, nv))
        f["mass"] = sc((n, nv, nv))
        for name in ("cfrc_ang", "cfrc_lin", "sub_frc_ang", "sub_frc_lin"):
            f[name] = v3((n, nb))
        f["qfrc_bias"], f["qfrc_total"], f["qacc"] = sc((n, nv)), sc((n, nv)), sc((n, nv))
        f["act_force"] = sc((n, nu))
        f["chol"] = sc((n, nv, nv), False)
        f["rhs"], f["rhs_bar"] = sc((n, nv), False), sc((n, nv), False)
        return cls(**f)

    def differentiated(self) -> list:
        """The intermediates whose gradients the reverse pass zeroes before each substep's adjoint."""
        return [fld for name, fld in self.items() if name not in ("chol", "rhs", "rhs_bar")]


@dataclass(eq=False)
class RowFields(_Group):
    """The rows a launch runs on (:meth:`bcg.sim.rollout.Simulator._set_rows`).

    Attributes:
        rows: the active rows, in order; entries past ``n_active`` are stale (n,).
        n_active: how many rows are active, ().
    """

    rows: ti.Field
    n_active: ti.Field

    @classmethod
    def allocate(cls, n: int) -> RowFields:
        return cls(Allocator.i32(n), ti.field(ti.i32, shape=()))


@dataclass(eq=False)
class ContactFields(_Group):
    """Sphere-ground contact (:mod:`bcg.sim.contact`): its settings, the spheres, and the intermediates
    of a contact substep. Without contact only ``friction`` and ``con_force_max`` exist.

    Attributes:
        friction: the ground friction coefficient mu, randomised (n,).
        con_force_max: N, the largest per-sphere contact force of the control step (n,).
        con_kappa: 1/m, stiffness of the smoothing s_kappa(d) = 1 / (1 + exp(-kappa d)), ().
        con_radius: m, sphere radius, ().
        con_ground: m, ground height, ().
        con_margin: m, the gap below which a sphere enters the solver, ().
        con_dcorr: the depth correction beta, (), dimensionless.
        sphere_body: the body carrying each sphere (nc,).
        sphere_pos: m, sphere centres in their body's frame (nc,) x 3.
        body_dof_anc: 1 where the dof moves the body, else 0 (nbody, nv).
        sphere_dof_start, sphere_dof_items: CSR lists of the dofs that move each sphere, ascending
            (nc + 1,), (nc nv,).
        sphere_block_hit: 1 where a block of SOLVE_BLOCK dofs holds one of them
            (nc, ceil(nv / SOLVE_BLOCK)).
        con_point: m, each sphere's lowest point (n, nc) x 3.
        con_depth: m, its depth below the ground (negative above) (n, nc).
        con_scale: s_kappa(depth), 0 out of the solver (n, nc).
        con_active: 1 for a sphere in the solver (gap <= margin), else 0 (n, nc).
        con_step: kg, the block step r_i = 1 / (Gershgorin bound of G_ii) (n, nc).
        con_force: N, each sphere's largest contact force over the control step (n, nc), not
            differentiated.
        jac: m per rad, the contact points' Jacobians J, row 3 i + a for sphere i, axis a (n, 3 nc, nv).
        rhs_m: the solve's right-hand sides [h (qfrc_total - qfrc_bias) | J^T], N m s and m
            (n, 1 + 3 nc, nv).
        sol_m: M^-1 rhs_m: column 0 the free velocity change, rad/s (n, 1 + 3 nc, nv).
        tmp_m: the solve adjoint's M^-1 sol_m_bar (n, 1 + 3 nc, nv), not differentiated.
        delassus: 1/kg, G = J M^-1 J^T (n, 3 nc, 3 nc).
        con_vel: m/s, the free contact velocities c = J v_free (n, 3 nc).
        impulse: N s, the solver's impulses P after each sweep, 0 the initial guess
            (iterations + 1, n, nc) x 3.
        pgs_cur, pgs_gnew: the sweep adjoint's impulses as read and their adjoints (n, nc) x 3.
        con_list: each row's candidate spheres (con_active = 1), ascending (n, nc).
        con_count: how many (n,).
    """

    friction: ti.Field
    con_force_max: ti.Field
    con_kappa: ti.Field = None
    con_radius: ti.Field = None
    con_ground: ti.Field = None
    con_margin: ti.Field = None
    con_dcorr: ti.Field = None
    sphere_body: ti.Field = None
    sphere_pos: ti.MatrixField = None
    body_dof_anc: ti.Field = None
    sphere_dof_start: ti.Field = None
    sphere_dof_items: ti.Field = None
    sphere_block_hit: ti.Field = None
    con_point: ti.MatrixField = None
    con_depth: ti.Field = None
    con_scale: ti.Field = None
    con_active: ti.Field = None
    con_step: ti.Field = None
    con_force: ti.Field = None
    jac: ti.Field = None
    rhs_m: ti.Field = None
    sol_m: ti.Field = None
    tmp_m: ti.Field = None
    delassus: ti.Field = None
    con_vel: ti.Field = None
    impulse: ti.MatrixField = None
    pgs_cur: ti.MatrixField = None
    pgs_gnew: ti.MatrixField = None
    con_list: ti.Field = None
    con_count: ti.Field = None

    @classmethod
    def allocate(
        cls, al: Allocator, n: int, nbody: int, nv: int, ncon: int, iterations: int, solve_block: int
    ) -> ContactFields:
        """The fields of ``ncon`` spheres (0: no contact, ``friction`` and ``con_force_max`` only)."""
        v3, sc, i32, nc, ncol = al.v3, al.sc, al.i32, ncon, 3 * ncon
        f = dict(friction=sc(n, False), con_force_max=sc(n, False))
        if ncon == 0:
            return cls(**f)
        for name in ("con_kappa", "con_radius", "con_ground", "con_margin", "con_dcorr"):
            f[name] = sc((), False)
        f["sphere_body"], f["sphere_pos"] = i32(nc), v3(nc, False)
        f["body_dof_anc"] = sc((nbody, nv), False)
        f["sphere_dof_start"], f["sphere_dof_items"] = i32(nc + 1), i32(nc * nv)
        f["sphere_block_hit"] = i32((nc, -(-nv // solve_block)))
        f["con_point"] = v3((n, nc))
        for name in ("con_depth", "con_scale", "con_active", "con_step"):
            f[name] = sc((n, nc))
        f["con_force"] = sc((n, nc), False)
        f["jac"] = sc((n, ncol, nv))
        f["rhs_m"], f["sol_m"] = sc((n, 1 + ncol, nv)), sc((n, 1 + ncol, nv))
        f["tmp_m"] = sc((n, 1 + ncol, nv), False)
        f["delassus"] = sc((n, ncol, ncol))
        f["con_vel"] = sc((n, ncol))
        f["impulse"] = v3((iterations + 1, n, nc))
        f["pgs_cur"], f["pgs_gnew"] = v3((n, nc), False), v3((n, nc), False)
        f["con_list"], f["con_count"] = i32((n, nc)), i32(n)
        return cls(**f)

    def differentiated(self) -> list:
        """The contact intermediates whose gradients the reverse pass zeroes before a substep's adjoint
        (empty without contact)."""
        if self.con_point is None:
            return []
        names = (
            "con_point", "con_depth", "con_scale", "con_active", "con_step", "jac", "rhs_m", "sol_m",
            "delassus", "con_vel", "impulse",
        )  # fmt: skip
        return [getattr(self, name) for name in names]


@dataclass(eq=False)
class SelfContactFields(_Group):
    """Penalty contact between two sets of the robot's capsules (:mod:`bcg.sim.self_contact`); ``np``
    capsule pairs, grouped by body pair (``nbp`` of them). Without it only ``npair`` (0) exists.

    Attributes:
        npair: capsule pairs (an int, not a field).
        sc_stiffness: N/m, k (). sc_damping: s/m, c (). sc_smoothing: 1/m, sigma (). sc_limit: N, L ().
        pair_body_a, pair_body_b: the two capsules' bodies (np,).
        pair_a0, pair_a1, pair_b0, pair_b1: m, the capsules' axis ends in their bodies' frames (np,) x 3.
        pair_radius: m, the sum of the two radii (np,).
        bp_body_a, bp_body_b: the bodies of each body pair (nbp,).
        bp_centre_a, bp_centre_b: m, the centres of the bodies' bounding spheres in their frames (nbp,) x 3.
        bp_reach: m, the sum of the two bounding radii and the activation distance (nbp,).
        bp_start: CSR: body pair q holds pairs bp_start[q] .. bp_start[q + 1] - 1 (nbp + 1,).
        dof_anc: 1 where the dof moves the body, else 0 (nbody, nv).
        pair_active: 1 for a pair within the activation distance, else 0 (n, np), not differentiated.
        pair_pa, pair_pb: m, the closest points of the two axes (n, np) x 3.
        pair_force: N, the force on capsule a (-it on b) (n, np) x 3.
        pair_list, pair_count: each row's active pairs, ascending (n, np), and how many (n,).
        qfrc_self: N m, the pairs' generalised force (n, nv).
        force_max: N, the largest pair force of the control step (n,), not differentiated.
    """

    npair: int
    sc_stiffness: ti.Field = None
    sc_damping: ti.Field = None
    sc_smoothing: ti.Field = None
    sc_limit: ti.Field = None
    pair_body_a: ti.Field = None
    pair_body_b: ti.Field = None
    pair_a0: ti.MatrixField = None
    pair_a1: ti.MatrixField = None
    pair_b0: ti.MatrixField = None
    pair_b1: ti.MatrixField = None
    pair_radius: ti.Field = None
    bp_body_a: ti.Field = None
    bp_body_b: ti.Field = None
    bp_centre_a: ti.MatrixField = None
    bp_centre_b: ti.MatrixField = None
    bp_reach: ti.Field = None
    bp_start: ti.Field = None
    dof_anc: ti.Field = None
    pair_active: ti.Field = None
    pair_pa: ti.MatrixField = None
    pair_pb: ti.MatrixField = None
    pair_force: ti.MatrixField = None
    pair_list: ti.Field = None
    pair_count: ti.Field = None
    qfrc_self: ti.Field = None
    force_max: ti.Field = None

    @classmethod
    def allocate(cls, al: Allocator, n: int, nbody: int, nv: int, npair: int, nbp: int) -> SelfContactFields:
        """The fields of ``npair`` capsule pairs in ``nbp`` body pairs (0: none, ``npair`` alone)."""
        if npair == 0:
            return cls(0)
        v3, sc, i32 = al.v3, al.sc, al.i32
        f = {name: sc((), False) for name in ("sc_stiffness", "sc_damping", "sc_smoothing", "sc_limit")}
        f["pair_body_a"], f["pair_body_b"] = i32(npair), i32(npair)
        for name in ("pair_a0", "pair_a1", "pair_b0", "pair_b1"):
            f[name] = v3(npair, False)
        f["pair_radius"] = sc(npair, False)
        f["bp_body_a"], f["bp_body_b"] = i32(nbp), i32(nbp)
        f["bp_centre_a"], f["bp_centre_b"] = v3(nbp, False), v3(nbp, False)
        f["bp_reach"], f["bp_start"] = sc(nbp, False), i32(nbp + 1)
        f["dof_anc"] = sc((nbody, nv), False)
        f["pair_active"] = sc((n, npair), False)
        f["pair_pa"], f["pair_pb"], f["pair_force"] = v3((n, npair)), v3((n, npair)), v3((n, npair))
        f["pair_list"], f["pair_count"] = i32((n, npair)), i32(n)
        f["qfrc_self"] = sc((n, nv))
        f["force_max"] = sc(n, False)
        return cls(npair, **f)

    def differentiated(self) -> list:
        """The intermediates whose gradients the reverse pass zeroes before a substep's adjoint."""
        if self.npair == 0:
            return []
        return [self.pair_pa, self.pair_pb, self.pair_force, self.qfrc_self]


@dataclass(eq=False)
class LimitFields(_Group):
    """Joint limits (:mod:`bcg.sim.joint_limits`), per dof; without them ``on`` (False) alone exists.

    Attributes:
        on: whether the simulator has them (a bool, not a field).
        lim_qadr: the qpos address of the dof's limited joint, 0 where none (nv,).
        lim_lo, lim_hi: rad or m, its range; -inf and +inf where none (nv,).
        lim_stiffness: N m/rad or N/m, k (nv,). lim_damping: N m s/rad or N s/m, c (nv,).
    """

    on: bool
    lim_qadr: ti.Field = None
    lim_lo: ti.Field = None
    lim_hi: ti.Field = None
    lim_stiffness: ti.Field = None
    lim_damping: ti.Field = None

    @classmethod
    def allocate(cls, al: Allocator, nv: int, on: bool) -> LimitFields:
        if not on:
            return cls(False)
        f = {name: al.sc(nv, False) for name in ("lim_lo", "lim_hi", "lim_stiffness", "lim_damping")}
        return cls(True, lim_qadr=al.i32(nv), **f)


@dataclass(eq=False)
class BundleFields(_Group):
    """The bookkeeping of the bundle rows (:mod:`bcg.sim.bundle`), uploaded before each bundle launch.

    Attributes:
        branch_src, branch_dst: each copy's environment row and its own row (max(pool rows, 1),).
        branch_dq: each copy's perturbation of qpos at the bundle's start (max(pool rows, 1), nq).
        branch_dv: rad/s, its perturbation of qvel (max(pool rows, 1), nv).
        n_branch: how many (src, dst) pairs are loaded, ().
        n_collapse: how many bundles the averaging reads, ().
        collapse_main, collapse_first: each averaged bundle's environment row and first copy row
            (max(max_bundles, 1),).
    """

    branch_src: ti.Field
    branch_dst: ti.Field
    branch_dq: ti.Field
    branch_dv: ti.Field
    n_branch: ti.Field
    n_collapse: ti.Field
    collapse_main: ti.Field
    collapse_first: ti.Field

    @classmethod
    def allocate(cls, fp, pool_rows: int, max_bundles: int, nq: int, nv: int) -> BundleFields:
        i32, nrows, nbun = Allocator.i32, max(pool_rows, 1), max(max_bundles, 1)
        src, dst = i32(nrows), i32(nrows)
        dq, dv = ti.field(fp, shape=(nrows, nq)), ti.field(fp, shape=(nrows, nv))
        n_branch, n_collapse = ti.field(ti.i32, shape=()), ti.field(ti.i32, shape=())
        return cls(src, dst, dq, dv, n_branch, n_collapse, i32(nbun), i32(nbun))
