"""Runs a memory-planned Schedule on any backend: one arena, values at planned offsets.

The backend provides these hooks (NumPy: backends/numpy_backend/planned.py; the CUDA
backend implements the same names):

    alloc_arena(nbytes) -> arena                    one pool allocation per compiled graph
    value_at(arena, offset, shape, dtype) -> value  a contiguous value inside the arena
    view(step, ins) -> value                        a view step (reshape/permute/expand/index)
    execute(step, ins, out, inplace=False)          run one kernel, writing into `out`
                                                    (inplace: a setitem writing ins[0])
    copy_into(dst, src)                             copy values (inputs in, writebacks out)
    clone(value) -> value                           a fresh pool copy (outputs by default)
    capture(run) -> replayable                      `replayable.replay()` must have the effect
                                                    of `run()`: NumPy calls it, CUDA records
                                                    the launches once into a CUDA Graph

Everything the steps touch has a fixed address between binds: arguments are copied into
their arena slots, and persistent arrays (externals) are re-bound (and re-captured) only
when the caller hands in a different buffer.
"""

from __future__ import annotations

from typing import Any

from pygpukit.passes import Schedule
from pygpukit.passes.memory_plan import MemoryPlan, plan_memory

_CAPTURES_KEPT = 4  # captures per program, one per recent set of addresses


class PlannedProgram:
    def __init__(self, schedule: Schedule, backend: Any, external: list[int] | None = None,
                 writeback: list[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.schedule = schedule
        self.backend = backend
        self.external = [s for s in (external or [])]
        self.plan: MemoryPlan = plan_memory(schedule, set(self.external) - {-1}, writeback)
        schedule.info["memory_plan"] = self.plan
        schedule.info["arena_bytes"] = self.plan.arena_bytes
        schedule.info["naive_bytes"] = self.plan.naive_bytes
        # The arena is allocated at the first call, or handed in by the scheduler (which
        # reserves it at admission): tracing alone holds no arena memory.
        self.arena: Any = None
        self.values: list[Any] = [None] * schedule.n_slots
        self._bound: tuple[int, ...] | None = None
        self._replay: Any = None
        self._pins: list[Any] = []  # storages the bound graph uses: kept resident, fixed
        self._captures: dict[Any, Any] = {}  # addresses -> replayable, oldest first
        self.kernels = [
            (k, st) for k, st in enumerate(schedule.steps)
            if st.out not in self.plan.alias or k in self.plan.inplace
        ]  # fmt: skip

    def use_arena(self, arena: Any) -> None:
        """Run in `arena` (a pool block of at least plan.arena_bytes) from the next call on;
        the caller owns it. Values move there, and the graph is re-bound."""
        if arena is self.arena:
            return
        nodes = self.schedule.graph.nodes
        for slot, off in self.plan.offsets.items():
            n = nodes[slot]
            self.values[slot] = self.backend.value_at(arena, off, n.shape, n.dtype)
        self.arena = arena
        self._bound = None

    def unbind(self) -> None:
        from pygpukit.memory import unpin_all

        unpin_all(self._pins)
        self._pins = []
        self._bound = None

    def __del__(self) -> None:
        try:
            self.unbind()
        except Exception:  # interpreter shutdown
            pass

    def bind(self, externals: list[Any]) -> None:
        """Point external slots at the caller's buffers; derive the views; capture."""
        from pygpukit.memory import pin_all

        # A captured graph holds addresses: what it touches must not move while bound.
        self.unbind()
        storage = self.backend.storage
        self._pins = pin_all([self.arena] + [storage(v) for v in externals])
        for slot, v in zip(self.external, externals, strict=True):
            if slot >= 0:
                self.values[slot] = v
        for k, st in enumerate(self.schedule.steps):
            if st.out in self.plan.alias and k not in self.plan.inplace:
                self.values[st.out] = self.backend.view(st, [self.values[i] for i in st.ins])
            elif k in self.plan.inplace:
                self.values[st.out] = self.values[st.ins[0]]
        self._bound = tuple(id(v) for v in externals)
        # Scheduled calls hand in a new arena each time, often at an address seen before:
        # a capture stays valid while every address it holds is the same.
        key = (self.arena.addr, self._bound, tuple(p.addr for p in self._pins),
               tuple(getattr(v, "ptr", None) for v in externals))  # fmt: skip
        replay = self._captures.pop(key, None)
        if replay is None:
            replay = self.backend.capture(self._run)
        self._captures[key] = replay
        while len(self._captures) > _CAPTURES_KEPT:
            self._captures.pop(next(iter(self._captures)))
        self._replay = replay

    def replay_info(self) -> dict[str, Any]:
        """What the backend's replayable reports (CUDA: whether a graph was captured, its
        node count, graph launches, eager runs, the fallback reason); {} before the first
        call."""
        r = self._replay
        keys = ("captured", "num_nodes", "replays", "eager_runs", "fallback")
        return {k: getattr(r, k) for k in keys if hasattr(r, k)}

    def _run(self) -> None:
        values, backend = self.values, self.backend
        inplace = self.plan.inplace
        for k, st in self.kernels:
            backend.execute(st, [values[i] for i in st.ins], values[st.out], k in inplace)
        for src, dst in self.plan.writeback:
            backend.copy_into(values[dst], values[src])

    def __call__(self, args: list[Any], externals: list[Any]) -> list[Any]:
        """Run once; returns the output values (arena views, valid until the next call)."""
        from pygpukit.memory import pinned

        if self.arena is None or self.arena.freed:
            self.use_arena(self.backend.alloc_arena(self.plan.arena_bytes))
        if self._bound is None or self._bound != tuple(id(v) for v in externals):
            self.bind(externals)
        storage = self.backend.storage
        with pinned([storage(v) for v in args]):
            for slot, v in zip(self.schedule.input_slots, args, strict=False):
                if slot >= 0:
                    self.backend.copy_into(self.values[slot], v)
        self._replay.replay()
        return [self.values[s] for s in self.schedule.output_slots]
