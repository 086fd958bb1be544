"""Quaternion and spatial-vector maths as Taichi functions.

Written as plain expressions (no built-in ``@``): reverse-mode compile time grows with the square of a
kernel's IR size and the built-in matrix product inflates it several-fold (see the project's Taichi
notes). Quaternions are (w, x, y, z). Spatial motion vectors are (angular, linear) pairs of 3-vectors
expressed in the world frame at a reference point; forces likewise (torque, force).
"""

import taichi as ti


@ti.func
def vec3(a, b, c):
    return ti.Vector([a, b, c])


@ti.func
def cross(a, b):
    return ti.Vector([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


@ti.func
def dot3(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@ti.func
def mv3(m, v):
    """Matrix-vector product m v for a 3x3 matrix."""
    return ti.Vector([m[i, 0] * v[0] + m[i, 1] * v[1] + m[i, 2] * v[2] for i in ti.static(range(3))])


@ti.func
def mtv3(m, v):
    """Transposed product m^T v for a 3x3 matrix."""
    return ti.Vector([m[0, i] * v[0] + m[1, i] * v[1] + m[2, i] * v[2] for i in ti.static(range(3))])


@ti.func
def mm3(a, b):
    return ti.Matrix(
        [
            [a[i, 0] * b[0, j] + a[i, 1] * b[1, j] + a[i, 2] * b[2, j] for j in ti.static(range(3))]
            for i in ti.static(range(3))
        ]
    )


@ti.func
def quat_mul(a, b):
    return ti.Vector(
        [
            a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
            a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
            a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
            a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0],
        ]
    )


@ti.func
def quat_normalize(q):
    n = ti.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    return q / n


@ti.func
def quat_to_mat(q):
    """Rotation matrix of a unit quaternion."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return ti.Matrix(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


@ti.func
def quat_axis_angle(axis, angle):
    """Quaternion of a rotation by ``angle`` about the unit ``axis``."""
    s = ti.sin(0.5 * angle)
    return ti.Vector([ti.cos(0.5 * angle), axis[0] * s, axis[1] * s, axis[2] * s])


@ti.func
def quat_exp(w, h):
    """exp(h w / 2) as a quaternion, smooth at w = 0 (rotation by |w| h about w)."""
    x = 0.25 * h * h * (w[0] * w[0] + w[1] * w[1] + w[2] * w[2])  # (theta / 2)^2
    small = x < 1e-8
    r = ti.sqrt(ti.max(x, 1e-12))
    c = ti.select(small, 1.0 - 0.5 * x + x * x / 24.0, ti.cos(r))
    sinc = ti.select(small, 1.0 - x / 6.0 + x * x / 120.0, ti.sin(r) / r)
    k = 0.5 * h * sinc
    return ti.Vector([c, k * w[0], k * w[1], k * w[2]])


@ti.func
def inertia_apply(m, h, inertia, ang, lin):
    """Spatial inertia (mass m, first moment h = m c, rotational inertia about the reference point)
    applied to a motion vector (ang, lin): returns the momentum (torque part, force part)."""
    return mv3(inertia, ang) + cross(h, lin), m * lin - cross(h, ang)


@ti.func
def motion_cross(va, vl, ma, ml):
    """Spatial motion cross product (va, vl) x (ma, ml)."""
    return cross(va, ma), cross(va, ml) + cross(vl, ma)


@ti.func
def force_cross(va, vl, fa, fl):
    """Spatial force cross product (va, vl) x* (fa, fl)."""
    return cross(va, fa) + cross(vl, fl), cross(va, fl)


# ---------------------------------------------------------------- adjoints (for hand-written reverse passes)
@ti.func
def outer3(a, b):
    """a b^T: the adjoint of m in m v is outer3(g, v)."""
    return ti.Matrix([[a[i] * b[j] for j in ti.static(range(3))] for i in ti.static(range(3))])


@ti.func
def quat_conj(q):
    return ti.Vector([q[0], -q[1], -q[2], -q[3]])


@ti.func
def quat_mul_adjoint(a, b, g):
    """(a_bar, b_bar) of c = quat_mul(a, b) for c_bar = g: g conj(b) and conj(a) g (c is bilinear)."""
    return quat_mul(g, quat_conj(b)), quat_mul(quat_conj(a), g)


@ti.func
def quat_normalize_adjoint(q, g):
    """q_bar of quat_normalize(q) for out_bar = g: (g - u (u . g)) / |q|, u = q / |q|."""
    n = ti.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    u = q / n
    return (g - u * (u[0] * g[0] + u[1] * g[1] + u[2] * g[2] + u[3] * g[3])) / n


@ti.func
def quat_to_mat_adjoint(q, m):
    """q_bar of quat_to_mat(q) for R_bar = m (the formula's derivative, q not assumed unit)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return 2.0 * ti.Vector(
        [
            -z * m[0, 1] + y * m[0, 2] + z * m[1, 0] - x * m[1, 2] - y * m[2, 0] + x * m[2, 1],
            y * m[0, 1] + z * m[0, 2] + y * m[1, 0] - 2 * x * m[1, 1] - w * m[1, 2] + z * m[2, 0]
            + w * m[2, 1] - 2 * x * m[2, 2],
            -2 * y * m[0, 0] + x * m[0, 1] + w * m[0, 2] + x * m[1, 0] + z * m[1, 2] - w * m[2, 0]
            + z * m[2, 1] - 2 * y * m[2, 2],
            -2 * z * m[0, 0] - w * m[0, 1] + x * m[0, 2] + w * m[1, 0] - 2 * z * m[1, 1] + y * m[1, 2]
            + x * m[2, 0] + y * m[2, 1],
        ]
    )  # fmt: skip


@ti.func
def inertia_apply_adjoint(m, h, inertia, ang, lin, g_a, g_l):
    """(m_bar, h_bar, inertia_bar, ang_bar, lin_bar) of inertia_apply for (torque_bar, force_bar) =
    (g_a, g_l)."""
    g_m = dot3(g_l, lin)
    g_h = cross(lin, g_a) - cross(ang, g_l)
    g_inertia = outer3(g_a, ang)
    g_ang = mtv3(inertia, g_a) - cross(g_l, h)
    g_lin = cross(g_a, h) + m * g_l
    return g_m, g_h, g_inertia, g_ang, g_lin
