"""The one-figure reads every queue handle offers (embedded in ``minibroker.handles``, remote in
``minibroker.remote``), apart from ``views`` so that the handles load without the views' dataclasses: a process
builds those only when something reads a view (issue 19, lazy imports; each dataclass costs a ``compile`` at import).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minibroker.broker.views import QueueStats


class QueueReads(ABC):
    """The one-figure reads of a queue handle, each from a fresh ``stats()`` (embedded and remote alike)."""

    @abstractmethod
    def stats(self) -> QueueStats:
        """Every count of the queue at one instant."""

    @property
    def depth(self) -> int:
        """Messages ready for delivery (not counting acquired ones or ones staged in transactions)."""
        return self.stats().ready

    @property
    def ready(self) -> int:
        return self.stats().ready

    @property
    def acquired(self) -> int:
        """Messages delivered to a consumer and not yet settled."""
        return self.stats().acquired

    @property
    def staged(self) -> int:
        """Messages posted in open transactions, invisible until commit."""
        return self.stats().staged
