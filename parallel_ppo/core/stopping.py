"""The signals that end a run, turned into a request the training loop reads at its boundaries."""

from __future__ import annotations

import signal
import threading


class StopRequest:
    """The handler of the signals that end a run (SIGINT, SIGTERM and the pre-emption signal): the first asks the
    loop to stop at the next boundary, a second SIGINT interrupts (unless `repeat_interrupts` is off: a rank of a
    distributed run that gets a second signal, e.g. SIGTERM when torchrun dies after passing on a Ctrl-C, must still
    stop with the others at the agreed update; torchrun kills ranks that take more than 30 s). With `on_preempt`
    `checkpoint`, the pre-emption signal asks for a checkpoint instead (`checkpoint_asked`) and the run goes on."""

    def __init__(self, repeat_interrupts: bool = True, preempt_signal: str = "", on_preempt: str = "stop") -> None:
        self.signum: int | None = None
        self.checkpoint_asked = False
        self.repeat_interrupts = repeat_interrupts
        self.preempt = signal.Signals[preempt_signal] if preempt_signal else None
        self.on_preempt = on_preempt
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
            return self
        for sig in (signal.SIGINT, signal.SIGTERM, self.preempt):
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if signum == self.preempt and self.on_preempt == "checkpoint":
            self.checkpoint_asked = True
            return
        if self.signum is not None:
            if self.repeat_interrupts and signum == signal.SIGINT:  # a second Ctrl-C; scheduler signals repeat
                raise KeyboardInterrupt
            return
        self.signum = signum

    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return self.signum is not None

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
