"""Which simulator rows a launch runs on, and how a loop over them is spread over a CPU's threads.

Every per-environment field has ``num_rows`` rows (the environments, then the bundle copies); a launch
runs on the active rows alone (``rows[:n_active]``, :meth:`RowScheduling._set_rows`). On a GPU every
loop over the rows is parallel. On a CPU, Taichi 1.7 runs a parallel loop of fewer than 1,024
iterations as one task (its adaptive block size is at least 512) on a pool thread: no parallelism,
and a round trip to the pool and back (0.03-0.15 ms here). So on a CPU the bookkeeping loops always
run on the launching thread (``_serial``), and every loop over the rows does while the batch is small
(``_serial_rows``), unless the rows are spread over ``_row_tasks`` of the pool's threads in blocks of
consecutive rows (:meth:`RowScheduling._row_of`). A mixin of :class:`bcg.sim.rollout.Simulator`.
"""

import numpy as np
import taichi as ti

from bcg.sim import runtime

SERIAL_STAGE_ENVS = 256  # up to this many environments every loop over the rows runs serially on a CPU
ROWS_PER_THREAD = 32  # SimConfig.cpu_threads=None: one pool thread per this many environments
ROW_TASK = 512  # items per task of Taichi 1.7's CPU range-for below 32,768 items (its adaptive block)


def padded(values, length: int, dtype) -> np.ndarray:
    """``values`` as a contiguous array of ``length`` rows, zero-filled past its end."""
    values = np.asarray(values, dtype)
    out = np.zeros((length, *values.shape[1:]), dtype)
    out[: len(values)] = values
    return out


class RowScheduling:
    def _setup_rows(self, config):
        """``_serial``, ``_serial_rows``, ``_row_tasks`` and ``_serial_row_loops`` for ``config``
        (a :class:`bcg.sim.rollout.SimConfig`) on the running backend."""
        self._serial = runtime.on_cpu()
        self._serial_rows = self._serial and config.num_envs <= SERIAL_STAGE_ENVS
        # ... unless the rows are spread over the pool's threads in blocks (_row_of)
        self._row_tasks = 1
        if self._serial_rows:
            pool = max(1, int(ti.lang.impl.current_cfg().cpu_max_num_threads))
            wanted = config.cpu_threads or config.num_envs // ROWS_PER_THREAD
            self._row_tasks = max(1, min(wanted, pool))
        self._serial_row_loops = self._serial_rows and self._row_tasks == 1  # the row loops' serialize

    @ti.func
    def _row_items(self):
        """Items of a loop over the active rows. On a CPU with T > 1 threads and at most
        ``ROW_TASK * T`` rows it is ``ROW_TASK * T``: Taichi cuts a range-for into tasks of
        ``ROW_TASK`` items, so a loop of 64 items is one task on one thread, while this one is T
        tasks, each with its own consecutive rows (see :meth:`_row_of`)."""
        n = self.active.n_active[None]
        if ti.static(self._row_tasks > 1):
            n = ti.max(n, ROW_TASK * self._row_tasks)
        return n

    def _serial_items(self, inner: int) -> bool:
        """``serialize`` of a loop over (active row, one of ``inner`` items): serial on a CPU where
        Taichi would make it one task anyway (fewer than two tasks' worth of items at
        ``num_envs`` rows), parallel over Taichi's tasks of ``ROW_TASK`` items otherwise."""
        if not self._serial_rows:
            return False
        return self._row_tasks == 1 or self.num_envs * inner < 2 * ROW_TASK

    @ti.func
    def _row_of(self, i):
        """The active row of item i of a :meth:`_row_items` loop (>= n_active: no row)."""
        r = i
        if ti.static(self._row_tasks > 1):
            n = self.active.n_active[None]
            if n <= ROW_TASK * self._row_tasks:
                per = (n + self._row_tasks - 1) // self._row_tasks
                j = i % ROW_TASK
                r = n  # no row
                if j < per:
                    r = (i // ROW_TASK) * per + j
        return r

    def _set_rows(self, rows: np.ndarray):
        key = rows.tobytes()
        if key != self._active_key:
            self._load_rows(padded(rows, max(len(rows), 1), np.int32), len(rows))
            self._active_key = key

    @ti.kernel
    def _load_rows(self, rows: ti.types.ndarray(), n: ti.i32):
        ti.loop_config(serialize=self._serial)
        for k in range(n):
            self.active.rows[k] = rows[k]
        self.active.n_active[None] = n
