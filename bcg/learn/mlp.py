"""Multilayer perceptron written by hand: forward, backward, initialisation, parameter trees.

A network is described by a frozen :class:`MLPSpec` and its parameters live in a plain ``dict`` of
numpy arrays, so optimisers, target copies and checkpoints treat every network alike.

Layout, for hidden layer ``i`` (``x`` is a row-major batch, ``y = x @ W + b``)::

    z = x @ w{i} + b{i}                      Linear        w{i}: (fan_in, fan_out)
    h = layer_norm(z) * ln_gain{i} + ln_bias{i}   LayerNorm (only when spec.layer_norm)
    a = act(h)                               ELU or ReLU

followed by the linear output layer ``y = a @ w_out + b_out``. LayerNorm sits between the Linear and
the activation, as in SHAC's actor and critic (``Linear -> LayerNorm -> ELU``).

Initialisation follows ``torch.nn.Linear``'s default, which SHAC and MimicKit both use:
weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)). The output layer may instead get
weights ~ U(-s, s) and a zero bias (``out_init_scale = s``), which MimicKit uses for its logits.

The parameter-tree helpers at the end turn nested dicts of arrays (parameters, optimiser state,
normaliser state, random-generator state) into HDF5 groups and back, bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

LAYER_NORM_EPS = 1e-5
ACTIVATIONS = ("elu", "relu")

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class MLPSpec:
    """Shape of a network.

    Attributes:
        in_dim: input features.
        hidden: widths of the hidden layers, e.g. ``(512, 256, 128)``.
        out_dim: output features.
        activation: ``"elu"`` or ``"relu"``.
        layer_norm: LayerNorm after every hidden Linear (before the activation).
    """

    in_dim: int
    hidden: tuple[int, ...]
    out_dim: int
    activation: str = "elu"
    layer_norm: bool = True

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.in_dim < 1 or self.out_dim < 1 or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"layer sizes must be positive: {self}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))


def mlp_init(
    spec: MLPSpec,
    rng: np.random.Generator,
    out_init_scale: float | None = None,
    dtype: Any = np.float32,
) -> Params:
    """New parameters for ``spec`` (see the module docstring for the initialisation)."""
    params: Params = {}
    fan_in = spec.in_dim
    for i, width in enumerate(spec.hidden):
        bound = 1.0 / np.sqrt(fan_in)
        params[f"w{i}"] = rng.uniform(-bound, bound, (fan_in, width)).astype(dtype)
        params[f"b{i}"] = rng.uniform(-bound, bound, width).astype(dtype)
        if spec.layer_norm:
            params[f"ln_gain{i}"] = np.ones(width, dtype)
            params[f"ln_bias{i}"] = np.zeros(width, dtype)
        fan_in = width
    if out_init_scale is None:
        bound = 1.0 / np.sqrt(fan_in)
        params["w_out"] = rng.uniform(-bound, bound, (fan_in, spec.out_dim)).astype(dtype)
        params["b_out"] = rng.uniform(-bound, bound, spec.out_dim).astype(dtype)
    else:
        params["w_out"] = rng.uniform(-out_init_scale, out_init_scale, (fan_in, spec.out_dim)).astype(dtype)
        params["b_out"] = np.zeros(spec.out_dim, dtype)
    return params


def _activate(h: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.maximum(h, 0)
    # ELU(h) = max(exp(min(h, 0)) - 1, h): exp(x) - 1 >= x everywhere, with equality only at 0.
    # numpy's float32 exp is vectorised and expm1 is not (about 8x slower); exp(x) - 1 differs
    # from expm1 by at most one float32 ulp of 1 near x = 0, far below the network's noise.
    # np.where is several times slower on large float32 arrays.
    a = np.minimum(h, 0)
    np.exp(a, out=a)
    a -= 1
    np.maximum(a, h, out=a)
    return a


def _activation_grad(a: np.ndarray, da: np.ndarray, activation: str) -> np.ndarray:
    """dL/dh from the activation's output ``a`` (a > 0 exactly where h > 0 for ELU and ReLU)."""
    if activation == "relu":
        return da * (a > 0)
    return da * (np.minimum(a, 0) + 1)


def mlp_forward(spec: MLPSpec, params: Params, x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Evaluate the network.

    Args:
        spec: network shape.
        params: from :func:`mlp_init`.
        x: inputs (..., in_dim); computed in the parameters' dtype.

    Returns:
        y: outputs (..., out_dim).
        cache: what :func:`mlp_backward` needs (it keeps a reference to ``x``: do not modify ``x``
            in place before the backward pass).
    """
    x = np.asarray(x)
    if x.shape[-1] != spec.in_dim:
        raise ValueError(f"input has {x.shape[-1]} features, the network expects {spec.in_dim}")
    lead = x.shape[:-1]
    dtype = params["w_out"].dtype
    a = x.reshape(-1, spec.in_dim).astype(dtype, copy=False)
    inputs, xhats, rstds = [], [], []
    for i in range(len(spec.hidden)):
        inputs.append(a)
        h = a @ params[f"w{i}"]
        h += params[f"b{i}"]
        if spec.layer_norm:
            inv_n = 1.0 / h.shape[1]
            h -= h.sum(axis=1, keepdims=True) * inv_n
            var = np.einsum("ij,ij->i", h, h)[:, None] * inv_n  # no temporary for h * h
            rstd = 1.0 / np.sqrt(var + LAYER_NORM_EPS)
            h *= rstd
            xhats.append(h)
            rstds.append(rstd)
            h = h * params[f"ln_gain{i}"]
            h += params[f"ln_bias{i}"]
        a = _activate(h, spec.activation)
    inputs.append(a)
    y = a @ params["w_out"] + params["b_out"]
    cache = {"spec": spec, "lead": lead, "inputs": inputs, "xhats": xhats, "rstds": rstds}
    return y.reshape(*lead, spec.out_dim), cache


def mlp_backward(
    params: Params, cache: dict, dy: np.ndarray, need_dx: bool = True
) -> tuple[Params, np.ndarray | None]:
    """Reverse pass of :func:`mlp_forward`.

    Args:
        params: the parameters used in the forward pass.
        cache: from :func:`mlp_forward`.
        dy: dL/dy (..., out_dim).
        need_dx: also return dL/dx (costs one more matrix product).

    Returns:
        grads: dL/dparams, same keys and shapes as ``params``.
        dx: dL/dx (..., in_dim), or None when ``need_dx`` is False.
    """
    spec: MLPSpec = cache["spec"]
    inputs = cache["inputs"]
    dtype = params["w_out"].dtype
    d = np.asarray(dy, dtype=dtype).reshape(-1, spec.out_dim)
    grads: Params = {"w_out": inputs[-1].T @ d, "b_out": d.sum(axis=0)}
    n_hidden = len(spec.hidden)
    if n_hidden == 0 and not need_dx:
        return grads, None
    da = d @ params["w_out"].T
    for i in reversed(range(n_hidden)):
        dh = _activation_grad(inputs[i + 1], da, spec.activation)
        if spec.layer_norm:
            xhat, rstd = cache["xhats"][i], cache["rstds"][i]
            inv_n = 1.0 / dh.shape[1]
            grads[f"ln_gain{i}"] = np.einsum("ij,ij->j", dh, xhat)
            grads[f"ln_bias{i}"] = dh.sum(axis=0)
            dz = dh * params[f"ln_gain{i}"]  # dL/dxhat, then dL/dz in place
            mean_dxhat = dz.sum(axis=1, keepdims=True) * inv_n
            mean_dxhat_xhat = np.einsum("ij,ij->i", dz, xhat)[:, None] * inv_n
            dz -= mean_dxhat
            dz -= xhat * mean_dxhat_xhat
            dz *= rstd
        else:
            dz = dh
        grads[f"w{i}"] = inputs[i].T @ dz
        grads[f"b{i}"] = dz.sum(axis=0)
        if i > 0 or need_dx:
            da = dz @ params[f"w{i}"].T
    if not need_dx:
        return grads, None
    return grads, da.reshape(*cache["lead"], spec.in_dim)


def cast_params(params: Params, dtype: Any) -> Params:
    """A copy of ``params`` in ``dtype`` (float64 for finite-difference checks)."""
    return {k: np.array(v, dtype=dtype) for k, v in params.items()}


def copy_params(params: Params) -> Params:
    """A deep copy (target networks)."""
    return {k: v.copy() for k, v in params.items()}


def polyak_update(target: Params, source: Params, alpha: float) -> None:
    """In place: target <- alpha * target + (1 - alpha) * source."""
    for k, v in target.items():
        v *= alpha
        v += (1.0 - alpha) * source[k]


# ---------------------------------------------------------------------------------------------
# Parameter trees: nested dicts whose leaves are numpy arrays, stored as HDF5 groups/datasets.


def flatten_tree(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}`` (keys must be non-empty and free of '/')."""
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise ValueError(f"tree keys must be non-empty strings without '/': {key!r}")
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_tree(value, path + "/"))
        else:
            flat[path] = np.asarray(value)
    return flat


def unflatten_tree(flat: dict[str, np.ndarray]) -> dict:
    """Inverse of :func:`flatten_tree`."""
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def write_tree_h5(group, tree: dict) -> None:
    """Write ``tree`` under an open ``h5py.Group`` (datasets at the leaves, exact dtypes)."""
    for path, value in flatten_tree(tree).items():
        group.create_dataset(path, data=value)


MAX_TREE_ELEMENTS = 400_000_000  # per dataset: 8x a checkpoint's replay buffer at the defaults


def read_tree_h5(group, max_elements: int = MAX_TREE_ELEMENTS) -> dict:
    """Read a tree written by :func:`write_tree_h5` (arrays; 0-d datasets come back 0-d).

    A dataset whose header declares more than ``max_elements`` values (or none: a null dataspace)
    raises ValueError before anything is read: a small damaged file cannot ask for all memory."""
    flat: dict[str, np.ndarray] = {}

    def visit(name, obj):
        if hasattr(obj, "dtype"):
            if obj.shape is None or int(np.prod(obj.shape, dtype=np.float64)) > max_elements:
                raise ValueError(f"dataset {name!r} declares shape {obj.shape}")
            flat[name] = np.array(obj[()])

    group.visititems(visit)
    return unflatten_tree(flat)


def rng_state(rng: np.random.Generator) -> np.ndarray:
    """The generator's full state as a uint8 array (its JSON text), storable in HDF5."""
    return np.frombuffer(json.dumps(rng.bit_generator.state).encode(), dtype=np.uint8).copy()


def rng_from_state(state: np.ndarray) -> np.random.Generator:
    """A generator that continues exactly where the one given to :func:`rng_state` was."""
    d = json.loads(np.asarray(state, dtype=np.uint8).tobytes().decode())
    bit_generator = getattr(np.random, d["bit_generator"])()
    bit_generator.state = d
    return np.random.Generator(bit_generator)
