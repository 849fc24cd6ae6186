"""The member service's tables: a points balance per customer and a ledger of awards."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, DateTime, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class MemberBase(DeclarativeBase):
    """Declarative base of the member service (its own metadata)."""


class MemberPoints(MemberBase):
    """The points a customer holds."""

    __tablename__ = "member_points"

    customer: Mapped[str] = mapped_column(String(64), primary_key=True)
    points: Mapped[int] = mapped_column(BigInteger, default=0)


class PointsAward(MemberBase):
    """One award per handled ``order.paid``; deliberately not unique on ``order_id``, so a
    second effect of one order would show up here instead of being hidden by a constraint."""

    __tablename__ = "member_points_award"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    customer: Mapped[str] = mapped_column(String(64))
    points: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[str] = mapped_column(String(64))
    awarded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=lambda: datetime.now(UTC)
    )
