"""The function form of a live session, for people who use ``notebook_launcher``.

Example::

    >>> import kernelside
    >>> with kernelside.start(num_processes=2) as ranks:        # doctest: +SKIP
    ...     ranks.run(load_model)                                 # stays on every rank
    ...     loss = ranks.run(train, args=(cfg,))                  # rank 0's value
"""

from __future__ import annotations

from ..config.launch_rules import arguments as config_arguments
from .session import LiveSession


class LiveRanks:
    """Handle on this kernel's live session: ``run``, ``push``, ``status``, ``restart``, ``stop``."""

    def __init__(self, session: LiveSession):
        self.session = session

    def run(self, function, args=(), kwargs=None, *, return_all: bool = False, ranks=None, timeout=None):
        """``function(*args, **kwargs)`` on every rank (or ``ranks``); rank 0's value (every rank's with
        ``return_all``). The function's globals are each rank's namespace: what earlier calls left there."""
        chosen = tuple(ranks) if ranks is not None else tuple(range(self.session.plan.num_processes))
        senders = chosen if return_all else (chosen[0],)
        outcome = self.session.run_function(function, args, kwargs, return_from=senders, ranks=ranks, timeout=timeout)
        return [outcome.values[r] for r in chosen] if return_all else outcome.values[chosen[0]]

    def push(self, **values) -> None:
        """Set these names on every rank: ``ranks.push(cfg=cfg)``."""
        self.session.push(list(values), source=values)

    def status(self) -> list[dict]:
        return self.session.status()

    def restart(self) -> None:
        self.session.restart()

    def stop(self) -> None:
        self.session.stop()

    def __enter__(self) -> LiveRanks:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(num_processes=None, *, config=None, **options) -> LiveRanks:
    """Start live ranks (the options of ``%distributed_start``: mixed_precision, backend, start_method,
    gpu_ids, output, progress, timeout, port); return once every rank is ready."""
    return LiveRanks(
        LiveSession.start(config_arguments("start", num_processes=num_processes, **options), config=config)
    )
