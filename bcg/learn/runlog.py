"""The training run's log: ``log.csv``, one row per SHAC iteration, and ``curves.png``, its main
columns plotted.

Log columns: ``iteration``; ``wall_time`` seconds of training since the run began (a resumed run
goes on from the last logged value; the time between the stop and the resume is not counted);
``reward`` mean reward per env-step of the window (episode steps only);
``episode_return`` / ``episode_length`` / ``fall_rate`` over the episodes that ended in the window
(empty when none did; ``fall_rate`` counts every early termination), ``episodes`` how many ended;
``lost_track_rate`` the fraction of them ended by the pose termination alone
(``env.pose_termination_dist``); ``tracking_error_cm`` global mean body-position error
against the reference;
``tracking_error_early_cm`` the same over the first 0.5 s of each episode only (not confounded by
the episode length);
``disc_accuracy`` mean of the discriminator's accuracy on the positive and the negatives; ``actor_loss`` the
window's loss (minus the mean bootstrapped return); ``actor_grad_norm`` before clipping, ``critic_grad_norm``
mean before clipping in the last critic pass, ``critic_loss`` its mean squared TD error, both of the critic
fit on the previous iteration's window (taken after this
iteration's rollout, :mod:`bcg.learn.shac`; empty in the first row);
``grad_variance`` variance across envs of each env's gradient with respect to the action mean
(scaled by N, averaged over the action dimensions); ``nan_grad_envs`` envs whose gradient was cut
where it turned non-finite; ``bcg_trigger_rate`` fraction of env-steps that opened a bundle;
``live_fraction`` fraction of the window's env-steps inside an episode (episodes are reset at window
boundaries, so an env whose episode ended inside the window idles until its end);
``leg_overlap_rate`` fraction of those env-steps in which the two legs' collision capsules overlap
(a strike in MuJoCo or on the robot; :mod:`bcg.learn.clearance`); ``action_std``
the mean over joints of the policy's action std in the window; ``lr_actor`` the actor's learning
rate; ``skipped`` 1 when the NaN guard skipped the update, ``nan_events`` how many non-finite events
it met; ``time_*`` seconds per phase (with the update worker ``time_critic`` and ``time_disc``
are the waits for its results).

PPO (:mod:`bcg.learn.ppo`) fills the same columns where they mean the same thing: ``actor_loss`` the
clipped surrogate, ``critic_loss`` the value loss and ``actor_grad_norm`` the norm over both networks
before clipping, each averaged over the iteration's minibatches, ``lr_actor`` the adapted learning
rate after them; and its own: ``kl`` the mean KL(π_old ‖ π) over the minibatches, ``clip_fraction``
the fraction of samples whose ratio the surrogate clips, ``time_update`` the seconds of GAE and the
minibatch passes. SHAC leaves those three empty, PPO the gradient columns SHAC alone has.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from bcg.core.atomic import atomic_write

LOG_COLUMNS = (
    "iteration",
    "wall_time",
    "reward",
    "episode_return",
    "episode_length",
    "episodes",
    "fall_rate",
    "tracking_error_cm",
    "tracking_error_early_cm",
    "disc_accuracy",
    "actor_loss",
    "actor_grad_norm",
    "critic_grad_norm",
    "critic_loss",
    "grad_variance",
    "nan_grad_envs",
    "bcg_trigger_rate",
    "live_fraction",
    "leg_overlap_rate",
    "action_std",
    "lr_actor",
    "skipped",
    "nan_events",
    "time_rollout",
    "time_backward",
    "time_critic",
    "time_disc",
    "time_iteration",
    "kl",
    "clip_fraction",
    "time_update",
    "lost_track_rate",
)


def read_log(path: Path) -> list[dict]:
    """The log's rows; rows that a crash or power loss left damaged (NUL bytes, a cut-off line, a
    missing or non-numeric iteration) are dropped: the log is a record and never stops a resume."""
    if not path.is_file():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace").replace("\0", "")
    rows = []
    for row in csv.DictReader(text.splitlines()):
        if None in row or any(v is None for v in row.values()):
            continue  # too many or too few fields
        try:
            int(row.get("iteration") or "")
        except ValueError:
            continue
        rows.append(row)
    return rows


def write_log(path: Path, rows: list[dict]) -> None:
    def write(tmp: Path):
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=LOG_COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


def append_log(path: Path, row: dict) -> None:
    new = not path.is_file() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LOG_COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


PLOTS = (
    ("episode_return", "episode return"),
    ("tracking_error_cm", "tracking error (cm)"),
    ("tracking_error_early_cm", "tracking error, first 0.5 s (cm)"),
    ("episode_length", "episode length (steps)"),
    ("disc_accuracy", "discriminator accuracy"),
    ("actor_grad_norm", "actor gradient norm"),
    ("critic_loss", "critic loss"),
    ("grad_variance", "gradient variance across envs"),
    ("action_std", "action std (mean over joints)"),
    ("time_iteration", "seconds per iteration"),
)

LOG_SCALE = ("actor_grad_norm", "critic_loss", "grad_variance", "kl")


def _number(text: str | None) -> float:
    """A log value as a float; empty or unreadable (a damaged row) is NaN, left out of the plot."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return np.nan


def plot_curves(log_path: Path, png_path: Path) -> None:
    """PNG of the main log columns against the iteration (matplotlib, Agg)."""
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    rows = read_log(log_path)
    if not rows:
        return
    plots = PLOTS
    if any(np.isfinite(_number(r.get("kl"))) for r in rows):  # a PPO run: no SHAC gradient variance
        plots = tuple(
            ("kl", "KL(π_old ‖ π) per minibatch") if c == "grad_variance" else (c, t) for c, t in PLOTS
        )
    it = np.array([float(r["iteration"]) for r in rows])  # read_log keeps whole iterations only
    fig, axes = plt.subplots(2, 5, figsize=(22, 8))
    for ax, (col, title) in zip(axes.ravel(), plots, strict=True):
        y = np.array([_number(r.get(col)) for r in rows])
        ok = np.isfinite(y)
        ax.plot(it[ok], y[ok], lw=1)
        if col in LOG_SCALE and np.all(y[ok] > 0) and ok.sum() > 1:
            ax.set_yscale("log")  # the first iterations are orders of magnitude above the rest
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(png_path, lambda p: fig.savefig(p, format="png", dpi=80))
    plt.close(fig)
