"""What a rank would otherwise import on its first DDP construction, imported ahead of time.

The kernel imports it in the background before it forks ranks (``engines.warmup``), and the forkserver's
template before it forks any (``worker.forkserver_template``): one list for both.

Example::

    >>> import_rank_modules()      # about 2.7 s the first time here (torch._dynamo)   # doctest: +SKIP
"""

from __future__ import annotations


def import_rank_modules() -> None:
    """Import torch.distributed, DDP and torch._dynamo (which the first DDP construction imports)."""
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    try:
        import torch._dynamo  # noqa: F401
    except Exception:
        pass  # a torch without dynamo: DDP does not import it either
