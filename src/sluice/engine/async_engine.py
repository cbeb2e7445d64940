"""The async front: an LLMEngine on its own thread, streaming events to asyncio callers.

The engine loop never awaits and never touches the event loop except through
`call_soon_threadsafe`; callers never touch the scheduler. Commands (add, abort) are drained at
the top of every iteration, so an abort frees its request's blocks before the next step.
Leaving `generate()` early (client disconnect, task cancellation) aborts the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from sluice.engine.engine import LLMEngine
from sluice.engine.stats import EngineStats
from sluice.errors import EngineDeadError, InvalidRequestError, SluiceError
from sluice.thread_name import name_this_thread
from sluice.types import AdapterRef, GenerationEvent, GenerationRequest

log = logging.getLogger(__name__)

_Sink = tuple[asyncio.AbstractEventLoop, asyncio.Queue]
# How long the engine sits idle before it gives back what the last burst left resident
# (LLMEngine.release_idle_memory). Long enough that back-to-back requests (one user chatting,
# a client's next call) never pay for it, short enough that memory after a burst is soon low.
IDLE_RELEASE_S = 1.0


class Command(enum.Enum):
    """What the event loop asks of the engine thread (its queue carries these, nothing else)."""

    ADD = "add"  # payload: a GenerationRequest, with the sink its events go to
    ABORT = "abort"  # payload: a request id


class AsyncEngine:
    """Runs an LLMEngine on its own thread.

    Pass `factory` (a callable that loads the model and builds the LLMEngine) instead of an
    engine to do that work on the engine thread itself. Why it matters: torch's CPU kernels use
    OpenMP, and libgomp keeps one thread pool per thread that starts parallel work. A model
    loaded on one thread and run on another leaves two pools on the machine's cores; libgomp
    then throttles its spin-waiting and every step gets slower (measured here: 35 ms → 55 ms
    per decode step). One thread for all torch work keeps one pool.
    """

    def __init__(
        self,
        engine: LLMEngine | None = None,
        factory: Callable[[], LLMEngine] | None = None,
        idle_release_s: float | None = IDLE_RELEASE_S,
    ):
        """`idle_release_s`: idle seconds before the engine releases memory (None: never)."""
        if (engine is None) == (factory is None):
            raise ValueError("pass exactly one of engine or factory")
        self._engine: LLMEngine | None = engine  # set on the engine thread when a factory builds it
        self._factory = factory
        self._idle_release_s = idle_release_s
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._commands: queue.SimpleQueue[tuple[Command, Any, _Sink | None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._sinks: dict[str, _Sink] = {}
        self._stats = engine.stats() if engine is not None else EngineStats()
        self._stopping = False
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sluice-engine", daemon=True)
        if engine is not None:
            self._loaded.set()

    async def wait_loaded(self) -> LLMEngine:
        """Wait until the factory has built the engine; re-raises its error."""
        await asyncio.get_running_loop().run_in_executor(None, self._loaded.wait)
        if self._load_error is not None:
            raise self._load_error
        return self.engine

    @property
    def engine(self) -> LLMEngine:
        """The engine (after wait_loaded(): a factory builds it on the engine thread)."""
        if self._engine is None:
            raise RuntimeError("the engine is not loaded yet: await wait_loaded() first")
        return self._engine

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running get an aborted final event."""
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._dead is None and self._loaded.is_set()

    # -- caller side ---------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream `request`'s events; the last has finished=True. Raises InvalidRequestError
        before anything is queued if the request is bad."""
        async for batch in self.generate_batches(request):
            for event in batch:
                yield event

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[GenerationEvent]]:
        """Like generate(), but yields every event already delivered as one list: a consumer
        that falls behind (a slow network writer) catches up in one message, not N."""
        if self._dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        if request.sampling.guided is None:
            self.engine.validate(request)
        else:  # compiling a new grammar can take a while (the first one also builds the
            # tokenizer view, ~1 s): off the event loop, so other streams keep flowing
            await asyncio.get_running_loop().run_in_executor(None, self.engine.validate, request)
        if request.adapter is not None:  # a LoRA adapter not resident yet loads here, not in a step
            await asyncio.get_running_loop().run_in_executor(None, self.engine.adapters.prefetch, request.adapter)
        events: asyncio.Queue = asyncio.Queue()
        self._submit(Command.ADD, request, (asyncio.get_running_loop(), events))
        finished = False
        try:
            while not finished:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                out: list[GenerationEvent] = []
                for item in batch:
                    if isinstance(item, BaseException):
                        finished = True
                        if out:
                            yield out
                        raise item
                    out.append(item)
                    finished = finished or item.finished
                yield out
        finally:
            if not finished:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        self._submit(Command.ABORT, request_id, None)

    async def load_adapter(self, adapter: AdapterRef) -> tuple[int, float]:
        """Make a LoRA adapter resident ahead of its requests (off the event loop and off the
        engine thread); (its bytes, the load's seconds, 0 if it was resident). AdapterError when
        it cannot be served; nothing else changes then."""
        engine = self.engine
        if engine.config.max_loras == 0:
            raise InvalidRequestError(f"this engine serves no LoRA adapters (max_loras = 0), so not {adapter.name!r}")
        cache = engine.adapters
        loads = cache.loads
        weights = await asyncio.get_running_loop().run_in_executor(None, cache.get, adapter)
        self._refresh_resident()
        return weights.nbytes, (cache.last_load_s if cache.loads != loads else 0.0)

    def unload_adapter(self, name: str) -> int:
        """Drop the resident adapters of that name (a later request for one reloads it)."""
        dropped = self.engine.adapters.unload(name)
        self._refresh_resident()
        return dropped

    def _refresh_resident(self) -> None:
        """The snapshot's resident adapters now, not at the next step (an idle engine takes none):
        a copy with those fields replaced (the cache is thread-safe; nothing else is read here)."""
        cache = self.engine.adapters
        snap = dataclasses.replace(self._stats)
        snap.lora_resident = sorted({ref.name for ref in cache.resident()})
        snap.lora_resident_bytes, snap.lora_loads, snap.lora_evictions = (
            cache.resident_bytes(),
            cache.loads,
            cache.evictions,
        )
        self._stats = snap

    def stats(self) -> EngineStats:
        """A snapshot taken after the last step (lock-free for the caller)."""
        return self._stats

    def _submit(self, kind: Command, payload: Any, sink: _Sink | None) -> None:
        self._commands.put((kind, payload, sink))
        self._wakeup.set()

    # -- engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        name_this_thread(self._thread.name)  # "sluice-engine" in top -H, py-spy and the like
        if self._factory is not None:
            try:
                self._engine = self._factory()
                self._stats = self.engine.stats()
            except BaseException as exc:  # reported to wait_loaded(); the loop never starts
                self._load_error = exc
                self._dead = exc
                return
            finally:
                self._loaded.set()
        release_due = True  # the load's own leftovers (the weights' staging, the tokenizer build)
        try:
            while not self._stopping:
                self._drain_commands()
                if self.engine.has_unfinished():
                    release_due = True
                    events = self.engine.step()
                    # the snapshot first: whoever sees a step's events sees at least that step's
                    # stats (a consumer checking num_running on its first token saw the idle
                    # snapshot from before its request was admitted)
                    self._stats = self.engine.stats()
                    self._deliver(events)
                else:
                    self._stats = self.engine.stats()
                    timeout = self._idle_release_s if release_due else None
                    if not self._wakeup.wait(timeout) and release_due:  # idle that long: give memory back
                        self.engine.release_idle_memory()
                        self._stats = self.engine.stats()
                        release_due = False
                    self._wakeup.clear()
            self._abort_all()
        except BaseException as exc:  # the loop itself broke: fail every stream, loudly
            log.exception("engine loop died")
            self._dead = exc
            self._fail_all(EngineDeadError(f"engine loop died: {exc}"))

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, payload, sink = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind is Command.ADD:
                assert sink is not None, "_submit hands every ADD its sink"
                try:
                    self.engine.add_request(payload)
                    self._sinks[payload.request_id] = sink
                except SluiceError as exc:
                    loop, q = sink
                    loop.call_soon_threadsafe(q.put_nowait, exc)
            elif kind is Command.ABORT:
                event = self.engine.abort_request(payload)
                if event is not None:
                    self._deliver([event])

    def _deliver(self, events: list[GenerationEvent]) -> None:
        # One call_soon_threadsafe per event loop per step, not per event.
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, GenerationEvent]]] = defaultdict(list)
        for ev in events:
            sink = self._sinks.pop(ev.request_id, None) if ev.finished else self._sinks.get(ev.request_id)
            if sink is not None:
                batches[sink[0]].append((sink[1], ev))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: its callers are gone
                for _, ev in items:
                    if not ev.finished:
                        self.engine.abort_request(ev.request_id)

    def _abort_all(self) -> None:
        events = [e for rid in list(self.engine.requests) if (e := self.engine.abort_request(rid))]
        self._deliver(events)

    def _fail_all(self, exc: BaseException) -> None:
        for loop, q in self._sinks.values():
            try:
                loop.call_soon_threadsafe(q.put_nowait, exc)
            except RuntimeError:
                pass
        self._sinks.clear()


def _put_all(items: list[tuple[asyncio.Queue, GenerationEvent]]) -> None:
    for q, ev in items:
        q.put_nowait(ev)
