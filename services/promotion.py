"""The promotion gate: ``promote --min-agreement A --min-compared N`` refuses a version whose
figures as a shadow (``services.shadow_stats``) do not meet the bar."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from common.errors import KindOfError
from services.shadow_stats import PairKey, PairStats


class PromotionRefused(KindOfError):
    """``promote`` with an agreement bar the shadow's figures do not meet."""

    status_code = 409


@dataclasses.dataclass(frozen=True)
class PromotionBar:
    min_agreement: float = 0.0
    min_compared: int = 0


def candidate_figures(
    pairs: Mapping[PairKey, PairStats], version: str, primaries: Iterable[str] | None = None
) -> tuple[PairStats, list[str]]:
    """``version``'s figures as a shadow of the other versions (only of ``primaries`` when given:
    the versions it would replace), added up; and those primaries."""
    allowed = set(primaries) if primaries is not None else None
    total, against = PairStats(), []
    for (primary, shadow), stats in sorted(pairs.items()):
        if shadow == version and primary != version and (allowed is None or primary in allowed):
            total.merge(stats)
            against.append(primary)
    return total, against


def require_agreement(
    pairs: Mapping[PairKey, PairStats], version: str, bar: PromotionBar, primaries: Iterable[str] | None = None
) -> PairStats:
    """Raise ``PromotionRefused`` (naming the figures) unless ``version``, as a shadow, agreed
    with the primaries on at least ``bar.min_agreement`` of at least ``bar.min_compared``
    predictions; returns the figures."""
    figures, against = candidate_figures(pairs, version, primaries)
    agreement = figures.agreement
    if figures.predictions >= bar.min_compared and (agreement or 0.0) >= bar.min_agreement:
        return figures
    shown = f"{agreement:.4f}" if agreement is not None else "none"
    raise PromotionRefused(
        f"promote {version} refused: agreement {shown} over {figures.predictions} predictions compared "
        f"({figures.agreed} agreed) as the shadow of {', '.join(against) or 'no primary'}; "
        f"the bar is agreement >= {bar.min_agreement} over >= {bar.min_compared} predictions"
    )
