"""Runs Schedules: every lazy realize and every compiled call goes through run_steps(),
one loop handing each step to the backend's execute() (the hooks are the PlannedBackend
protocol of backends/base.py). A lazy run (run_schedule) lets each step allocate its
result and drops dead values; a compiled program (PlannedProgram) runs in one arena, each
step writing into its planned slot.

Everything the steps touch has a fixed address while a capture is replayed. Arguments
and fresh outputs are bound by address: the graph reads the caller's buffers and writes
new output blocks directly, with no copy in or out. A capture bakes those addresses in,
so the program keeps the last few captures keyed by the addresses they hold (the pool
usually hands back the block just freed, so addresses recur); when they keep changing,
the program falls back for good to copying arguments into their arena slots and outputs
out of theirs, which needs one capture only. Persistent arrays (externals) are re-bound
(and re-captured) only when the caller hands in a different buffer. The values list points
at a call's arguments and new blocks only while steps run from Python (a capture, NumPy, the
re-issue fallback): replaying a recording needs nothing but the addresses in its key.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pygpukit import memory
from pygpukit.passes import Schedule, Step
from pygpukit.passes.memory_plan import MemoryPlan, plan_memory

if TYPE_CHECKING:
    from pygpukit.backends.base import PlannedBackend

# A step as run_steps takes it: the step, whether it writes ins[0] in place, and the slots
# that die after it (their values are dropped).
RunStep = tuple[Step, bool, tuple[int, ...]]

_CAPTURES_KEPT = 8  # captures per program, one per recent set of addresses
# Captures made for new argument/output addresses before binding gives up and copies:
# a re-capture of a big graph costs milliseconds, a copy a few microseconds.
_MISSES_ALLOWED = 16
# A capture costs about one Python launch per kernel twice (an eager run, then the
# recording): cheap for a few kernels, milliseconds for a decode step of hundreds. Bigger
# programs bind only large arguments and outputs, where a copy costs real bandwidth; their
# small ones (device scalars, token ids), whose addresses change call to call, are copied
# into their slots, so the one capture stays valid.
_CHEAP_KERNELS = 16
_BIG_BYTES = 1 << 20
_TOKENS_KEPT = 64
_NONE = (object(), None)  # no replay: a key that equals no other
_token_ids = itertools.count()


def run_steps(backend: PlannedBackend, steps: Sequence[RunStep], values: list[Any],
              launch: Any) -> None:  # fmt: skip
    """Run `steps` over `values` (indexed by slot): each step reads its inputs' values and
    gets values[step.out] as its output slot (None: it allocates its result, the lazy
    policy; a value: it writes there, the planned one)."""
    execute = backend.execute
    for step, inplace, frees in steps:
        out = step.out
        values[out] = execute(step, [values[i] for i in step.ins], values[out], inplace, launch)
        for s in frees:
            values[s] = None


def run_schedule(backend: PlannedBackend, schedule: Schedule, inputs: Sequence[Any]) -> list[Any]:
    """A lazy run of `schedule`: inputs bind to its input slots in order; every step
    allocates its result, and values die after their last reader."""
    steps: list[RunStep] | None = schedule.info.get("lazy_steps")
    if steps is None:
        steps = schedule.info["lazy_steps"] = [(st, False, st.frees) for st in schedule.steps]
    values: list[Any] = [None] * schedule.n_slots
    for slot, v in zip(schedule.input_slots, inputs, strict=True):
        if slot >= 0:  # -1: an input the passes left unread
            values[slot] = v
    run_steps(backend, steps, values, backend.new_launch(schedule, inputs))
    return [values[s] for s in schedule.output_slots]


class PlannedProgram:
    def __init__(self, schedule: Schedule, backend: PlannedBackend,
                 external: list[int] | None = None, writeback: list[tuple[int, int]] | None = None,
                 n_user: int | None = None) -> None:  # fmt: skip
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
        self._owns_arena = False  # allocated here (not a scheduler's): close() frees it
        self.values: list[Any] = [None] * schedule.n_slots
        self._homes: list[tuple[int, Any]] = []  # (slot, its arena value): args, outputs
        self._bound: tuple[int, ...] | None = None
        self._bind_token = -1
        self._tokens: dict[Any, int] = {}  # bind keys seen -> token
        self._last_key: Any = None
        self._eager: Any = None  # the replayable that re-issues launches, once capture failed
        # The last two replays, when they are graphs holding their keys' addresses:
        # (key, replayable), else _NONE. Fresh outputs alternate between two blocks (the
        # caller holds the last result while the next call allocates), and so do keys.
        self._hot: tuple[Any, Any] = _NONE
        self._cold: tuple[Any, Any] = _NONE
        self._span = (0, 0)
        self._external_storages: set[int] = set()
        self._replay: Any = None
        self._pins: list[Any] = []  # storages the bound graph uses: kept resident, fixed
        self._captures: dict[Any, Any] = {}  # addresses -> replayable, oldest first
        # Arguments and fresh outputs by address; each falls back to copies on its own
        # once new addresses of its kind cost more than _MISSES_ALLOWED captures.
        self.bind_args = True
        self.bind_outputs = True
        self.bind_misses = {"args": 0, "outputs": 0}
        # The backend's inlined call for the usual hit (quick_call), made for the current
        # arena and binding; None until a call made one, and again whenever either changes.
        self.quick: Any = None
        self.kernels = [
            (k, st) for k, st in enumerate(schedule.steps)
            if st.out not in self.plan.alias or k in self.plan.inplace
        ]  # fmt: skip
        # What run_steps takes: views are derived when values are bound, never run here,
        # and no value dies (the arena's slots live as long as the program).
        self._steps: list[RunStep] = [(st, k in self.plan.inplace, ()) for k, st in self.kernels]
        self._layout(len(schedule.graph.outputs) if n_user is None else n_user)
        pool = getattr(backend, "pool", None)
        self._evicting_pool = pool if getattr(pool, "evicts", False) else None

    def _layout(self, n_user: int) -> None:
        """Which slots a call may bind to caller memory, and the views derived from them."""
        plan, sched = self.plan, self.schedule
        outs = list(sched.output_slots)
        external = set(self.external)
        # An argument viewed by an output is always copied: the output must not alias the
        # caller's array (a static output would, after the call).
        out_roots = {plan.root(s) for s in outs if s >= 0}
        nodes = sched.graph.nodes
        cheap = len(self.kernels) <= _CHEAP_KERNELS

        def worth(s: int) -> bool:
            n = nodes[s]
            return cheap or math.prod(n.shape) * n.dtype.itemsize >= _BIG_BYTES

        self._arg_slots = [
            (s, s not in out_roots and worth(s)) if s >= 0 and s not in external else (-1, False)
            for s in sched.input_slots
        ]  # fmt: skip
        produced = {st.out for _, st in self.kernels if st.out not in plan.alias}
        wb = {s for pair in plan.writeback for s in pair}
        self._fresh_slots = [
            s for s in outs[:n_user]
            if s in produced and outs.count(s) == 1 and s not in wb and s in plan.offsets
            and worth(s)
        ]  # fmt: skip
        self._fresh_index = [outs.index(s) for s in self._fresh_slots]
        self._fresh_specs = [(s, nodes[s].shape, nodes[s].dtype) for s in self._fresh_slots]
        self._arg_layout = [
            (s, ok, nodes[s].shape, nodes[s].dtype,
             math.prod(nodes[s].shape) * nodes[s].dtype.itemsize)
            if s >= 0 else (s, ok, (), None, 0)
            for s, ok in self._arg_slots
        ]  # fmt: skip
        # An argument in a persistent array the graph writes is copied in first: a bound
        # one could be read after a step overwrote it.
        self._writes_external = bool(plan.writeback) or any(
            plan.root(sched.steps[k].ins[0]) in external for k in plan.inplace
        )
        bindable = {s for s, ok in self._arg_slots if ok} | set(self._fresh_slots)
        self._dep_views = [
            (k, st) for k, st in enumerate(sched.steps)
            if st.out in plan.alias and k not in plan.inplace and plan.root(st.out) in bindable
        ]  # fmt: skip
        # An output read from the values list that is such a view: _fill() derives it.
        self._views_out = bool({st.out for _, st in self._dep_views} & set(outs))
        self._n_user = n_user
        self._out_slots = outs
        self._tail = len(outs) > n_user  # writeback values follow the user outputs

    def use_arena(self, arena: Any) -> None:
        """Run in `arena` (a pool block of at least plan.arena_bytes) from the next call on;
        the caller owns it. Values move there, and the graph is re-bound."""
        if arena is self.arena:
            return
        self._owns_arena = False
        nodes = self.schedule.graph.nodes
        for slot, off in self.plan.offsets.items():
            n = nodes[slot]
            self.values[slot] = self.backend.value_at(arena, off, n.shape, n.dtype)
        slots = [s for s, _ in self._arg_slots if s >= 0] + self._fresh_slots
        self._homes = [(s, self.values[s]) for s in slots]
        # Each argument's layout and its arena slot, which it is copied into when not bound.
        self._arg_specs = [(*spec, self.values[spec[0]] if spec[0] >= 0 else None)
                           for spec in self._arg_layout]  # fmt: skip
        self.arena = arena
        self._bound = None
        self.quick = None

    def unbind(self) -> None:
        from pygpukit.memory import unpin_all

        unpin_all(self._pins)
        self._pins = []
        self._bound = None
        self.quick = None

    def close(self) -> None:
        """Give back what the program holds: its pins, its captured graphs and the arena
        it allocated (a compiled function's evicted cache entry). A later call starts
        again from a new arena and a new capture."""
        self.unbind()
        self._captures.clear()
        self._hot = self._cold = _NONE
        self._replay = self._eager = None
        self._last_key = None
        self._tokens.clear()
        self.values = [None] * self.schedule.n_slots
        self._homes = []
        arena, self.arena = self.arena, None
        if arena is not None and self._owns_arena:
            arena.release()
        self._owns_arena = False

    def __del__(self) -> None:
        try:
            self.unbind()
        except Exception:  # interpreter shutdown
            pass

    def bind(self, externals: list[Any]) -> None:
        """Point external slots at the caller's buffers; derive the views."""
        from pygpukit.memory import pin_all

        # A captured graph holds addresses: what it touches must not move while bound.
        self.unbind()
        storage = self.backend.storage
        self._pins = pin_all([self.arena] + [storage(v) for v in externals])
        self._external_storages = {id(p) for p in self._pins}
        self._span = (self.arena.addr, self.arena.addr + self.arena.nbytes)  # pinned now
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
        # A small token stands for it in capture keys: hashed on every call.
        # Tokens are never reused, so forgetting old keys cannot alias two bindings.
        if len(self._tokens) > _TOKENS_KEPT:
            self._tokens.clear()
        token = self._tokens.get(key)
        if token is None:
            token = self._tokens[key] = next(_token_ids)
        self._bind_token = token
        self.quick = None

    def replay_info(self) -> dict[str, Any]:
        """What the backend's replayable reports (CUDA: whether a graph was captured, its
        node count, graph launches, eager runs, the fallback reason, where the first call's
        time went), with the captures kept, the captures made for new argument addresses
        and whether arguments are bound or copied; {} before the first call."""
        r = self._replay
        if r is None:
            return {}
        keys = ("captured", "num_nodes", "replays", "eager_runs", "fallback", "first_call")
        out = {k: getattr(r, k) for k in keys if hasattr(r, k)}
        out.update(captures=len(self._captures), bind_misses=dict(self.bind_misses),
                   bind_args=self.bind_args, bind_outputs=self.bind_outputs)  # fmt: skip
        return out

    def _run(self, launch: Any) -> None:
        """The program's steps, then its writebacks (what a capture records)."""
        values, backend = self.values, self.backend
        run_steps(backend, self._steps, values, launch)
        for src, dst in self.plan.writeback:
            backend.copy_into(values[dst], values[src], launch)

    def __call__(self, args: list[Any], externals: list[Any]) -> list[Any]:
        """Run once; returns the output values (arena views, valid until the next call)."""
        return self.call(args, externals, fresh=False)

    def call(self, args: list[Any], externals: list[Any], fresh: bool,
             same_externals: bool = False, bind_outputs: bool = True) -> list[Any]:  # fmt: skip
        """Run once. fresh: the first n_user outputs are values the caller owns (the
        rest, writebacks, are arena views); otherwise all are arena views, valid until
        the next call. same_externals: the caller knows `externals` are the values of
        the last call (skips comparing them). bind_outputs=False: fresh outputs are
        copied out of the arena rather than written into new blocks (callers that keep
        every result, whose addresses never recur)."""
        arena = self.arena
        if arena is None or arena.freed:
            self.use_arena(self.backend.alloc_arena(self.plan.arena_bytes))
            self._owns_arena = True
        if self._bound is None or (
            not same_externals and self._bound != tuple(id(v) for v in externals)
        ):
            self.bind(externals)
        evicting = self._evicting_pool
        evictions = evicting.evictions if evicting is not None else 0
        news: list[Any] = []
        places: list[Any] = [self._bind_token]  # a capture's key: the addresses it holds
        if fresh and bind_outputs and self.bind_outputs:
            # Allocated before argument addresses are read: an allocation may move
            # evictable blocks.
            new = self.backend.fresh
            for _, shape, dtype in self._fresh_specs:
                v, place = new(shape, dtype)
                news.append(v)
                places.append(place)
        n_out = len(news)
        self._bind_args(args, places)
        if evicting is not None and evicting.evictions != evictions:
            # A block moved while addresses were read: read them again with all pinned.
            places = self._bind_pinned(args, news, places[: 1 + n_out])
        key = tuple(places)
        try:
            hot = self._hot
            if key == hot[0]:
                hot[1].replay()  # the graph holds these addresses: no values to set
            elif key == self._cold[0]:
                cold = self._cold
                self._hot, self._cold, self._last_key, self._replay = cold, hot, key, cold[1]
                cold[1].replay()
            else:
                self._replay_for(key, n_out, args, news)
            if self.quick is None and same_externals and n_out and self._hot[0] == key:
                self.quick = self._make_quick()  # a graph replayed: the next hit may be quick
            if fresh and n_out == self._n_user and not self._tail:
                return news  # every result written directly (the usual case)
            if self._views_out:
                self._fill(key, n_out, args, news)
            return self._outputs(news) if fresh else [self.values[s] for s in self._out_slots]
        except BaseException:
            # A failed step: the new blocks go back now, not when the traceback (kept by
            # a scheduler's failed task, say) lets go of this frame.
            for v in news:
                self.backend.storage(v).release()
            raise
        finally:
            if self._views_out:
                self._unfill()

    def _make_quick(self) -> Any:
        """The backend's quick_call for this program, where a call can take it: every
        user output written into a fresh block, every argument bound by address, no
        persistent array written; else None (call() does everything)."""
        make = getattr(self.backend, "quick_call", None)
        if (
            make is None
            or not (self.bind_args and self.bind_outputs)
            or self._writes_external
            or self._tail
            or self._views_out
            or len(self._fresh_specs) != self._n_user
            or not all(slot >= 0 and ok for slot, ok, *_ in self._arg_specs)
        ):
            return None
        return make(self)

    def replay_quick(self, key: tuple[Any, ...], args: list[Any], news: list[Any]) -> None:
        """What call() does once a quick_call has read the addresses (key): replay the
        graph made for them, capturing it first if none; the new blocks are released if
        that fails."""
        hot = self._hot
        try:
            if key == hot[0]:
                hot[1].replay()
            elif key == self._cold[0]:
                cold = self._cold
                self._hot, self._cold, self._last_key, self._replay = cold, hot, key, cold[1]
                cold[1].replay()
            else:
                self._replay_for(key, len(news), args, news)
        except BaseException:
            for v in news:
                self.backend.storage(v).release()
            raise

    def _bind_args(self, args: list[Any], places: list[Any]) -> None:
        """Decide for each argument: read in place (bound: appends its address to
        `places`) or copied into its arena slot (appends None). The values list is set
        from `places` only when a step runs from Python (_fill)."""
        backend = self.backend
        place_of = backend.place
        lo, hi = self._span
        check = self._writes_external
        binding = self.bind_args
        for (slot, ok, shape, dtype, nbytes, home), v in zip(self._arg_specs, args):  # noqa: B905
            if slot < 0:
                continue
            place = place_of(v, shape, dtype)
            # Memory in this arena (a static output fed back) or in a persistent array the
            # graph writes is copied, so no step reads bytes another one overwrote.
            if (place is not None and binding and ok and not lo <= place < hi
                    and not (check and self._in_external(v))):  # fmt: skip
                places.append(place)
                continue
            if place is None:  # another layout or dtype: a strided copy or a cast
                backend.copy_into(home, v)
            else:
                backend.copy_placed(home, v, place, nbytes)
            places.append(None)

    def _fill(self, key: tuple[Any, ...], n_out: int, args: list[Any],
              news: list[Any]) -> None:  # fmt: skip
        """Point the values list at this call's bound arguments and new output blocks
        (key: as _bind_args left it), and derive the views of them; _unfill() undoes it."""
        values, backend = self.values, self.backend
        for (s, _, _), v in zip(self._fresh_specs, news, strict=False):
            values[s] = v
        k = 1 + n_out
        for (slot, *_), v in zip(self._arg_specs, args, strict=False):
            if slot >= 0:
                if key[k] is not None:
                    values[slot] = v
                k += 1
        for _, st in self._dep_views:
            values[st.out] = backend.view(st, [values[i] for i in st.ins])

    def _unfill(self) -> None:
        """Drop references to caller memory: the pool can hand the blocks out again."""
        values = self.values
        for slot, v in self._homes:
            values[slot] = v
        for _, st in self._dep_views:
            values[st.out] = None

    def _in_external(self, value: Any) -> bool:
        return id(self.backend.storage(value)) in self._external_storages

    def _bind_pinned(self, args: list[Any], news: list[Any],
                     places: list[Any]) -> list[Any]:  # fmt: skip
        storage = self.backend.storage
        held = memory.pin_all([storage(v) for v in list(args) + news])
        try:
            self._bind_args(args, places)
        finally:
            memory.unpin_all(held)
        return places

    def _replay_for(self, key: tuple[Any, ...], n_out: int, args: list[Any],
                    news: list[Any]) -> None:  # fmt: skip
        """Replay the capture made for these addresses (key: the binding's token, the n_out
        fresh outputs' addresses, then the arguments'), capturing it first if none. The
        caller replays the last two itself when they hold their keys' addresses."""
        replay = self._eager
        new = False
        if replay is None:
            captures = self._captures
            replay = captures.pop(key, None)
            new = replay is None
            if new:
                self._count_miss(key, n_out)
                replay = self.backend.capture(self._run)
            captures[key] = replay  # most recent last
            if len(captures) > _CAPTURES_KEPT:
                for k in (self._cold[0], self._hot[0]):  # replayed without moving them
                    if k in captures:
                        captures[k] = captures.pop(k)
                captures.pop(next(iter(captures)))
            self._last_key, self._replay = key, replay
        if not getattr(replay, "reads_values", True):
            replay.replay()  # a captured graph: it holds the addresses the key names
            self._hot, self._cold = (key, replay), self._hot
            return
        # The replay runs the steps from Python (a first replay, a NumPy one, or the
        # re-issued launches of a program whose capture failed): they read the values.
        self._hot, self._cold = _NONE, _NONE
        storage = self.backend.storage
        self._fill(key, n_out, args, news)
        try:
            if new:
                # A first replay may allocate (evicting unpinned blocks): the arguments and
                # outputs must stay at the addresses the key names.
                with memory.pinned([storage(v) for v in list(args) + news]):
                    replay.replay()
            else:
                replay.replay()
        finally:
            self._unfill()
        if new and getattr(replay, "fallback", None):
            self._eager = replay  # a second capture would fail the same way
        if not getattr(replay, "reads_values", True):  # captured just now
            self._hot = (key, replay)

    def _count_miss(self, key: tuple[Any, ...], n_out: int) -> None:
        """A capture for new addresses with the same externals and arena: charge it to
        the arguments or the outputs, whichever moved, and stop binding those (from the
        next call on) once they have cost too many captures."""
        last = self._last_key
        if last is None or last[0] != key[0] or len(last) != len(key):
            return
        cut = 1 + n_out
        for kind, moved in (("outputs", last[1:cut] != key[1:cut]),
                            ("args", last[cut:] != key[cut:])):  # fmt: skip
            if moved:
                self.bind_misses[kind] += 1
                if self.bind_misses[kind] > _MISSES_ALLOWED:
                    setattr(self, f"bind_{kind}", False)
                    self.quick = None

    def _outputs(self, news: list[Any]) -> list[Any]:
        """The user outputs as values the caller owns: those the graph wrote into new
        blocks as they are, the rest (views, arguments, persistent arrays, and all of
        them when copying) cloned out of the arena; then the writebacks' arena views."""
        n, clone, values = self._n_user, self.backend.clone, self.values
        if len(news) == n:  # every result written directly (the usual case)
            return news + [values[s] for s in self._out_slots[n:]] if self._tail else news
        out = [values[s] for s in self._out_slots]
        if not news:
            return [clone(v) for v in out[:n]] + out[n:]
        res = list(out)
        for k, v in zip(self._fresh_index, news, strict=True):
            res[k] = v
        direct = set(self._fresh_index)
        for k in range(n):
            if k not in direct:
                res[k] = clone(out[k])
        return res
