"""The demo's invariants, read straight from the two services' databases.

No points without payment, no payment without points, each paid order counted once:

* sum of balances + sum of paid amounts == the money the customers started with;
* every paid order was consumed exactly once (one ``consumed_message`` row, one award);
* no award exists for an order that was not paid (a phantom);
* points per customer == amounts paid per customer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import create_engine, text

from outbox.schema import STORED_MESSAGE


@dataclass(frozen=True)
class LedgerReport:
    """What both databases say once the demo has settled."""

    customers: int
    initial_total: int
    balances_total: int
    orders_paid: int
    amount_paid: int
    points_awarded: int
    orders_consumed: int
    lost: int
    phantom: int
    duplicate_effects: int
    points_mismatched_customers: int

    @property
    def money_conserved(self) -> bool:
        return self.balances_total + self.amount_paid == self.initial_total

    @property
    def ok(self) -> bool:
        return (
            self.money_conserved
            and self.lost == 0
            and self.phantom == 0
            and self.duplicate_effects == 0
            and self.points_mismatched_customers == 0
            and self.points_awarded == self.amount_paid
        )

    def rows(self) -> list[tuple[str, str]]:
        """The table the demo prints."""
        return [
            ("customers", str(self.customers)),
            ("orders paid", str(self.orders_paid)),
            ("amount taken from balances", str(self.initial_total - self.balances_total)),
            ("amount of paid orders", str(self.amount_paid)),
            ("points awarded", str(self.points_awarded)),
            ("messages consumed", str(self.orders_consumed)),
            ("lost (paid, no points)", str(self.lost)),
            ("phantom (points, no payment)", str(self.phantom)),
            ("duplicate effects", str(self.duplicate_effects)),
            ("customers whose points != paid", str(self.points_mismatched_customers)),
            ("money conserved", "yes" if self.money_conserved else "NO"),
        ]


def read_ledger(account_url: str, member_url: str, initial_total: int) -> LedgerReport:
    """Compare the account database (orders, balances) with the member database (awards)."""
    account = create_engine(account_url)
    member = create_engine(member_url)
    try:
        with account.connect() as conn:
            customers = conn.execute(text("SELECT count(*), coalesce(sum(balance), 0) FROM shop_account_customer")).one()
            paid = {
                order_id: (customer, amount)
                for order_id, customer, amount in conn.execute(
                    text(
                        "SELECT o.order_id, c.name, o.amount FROM shop_account_order o "
                        "JOIN shop_account_customer c ON c.id = o.customer_id"
                    )
                )
            }
        with member.connect() as conn:
            awards = list(conn.execute(text("SELECT order_id, customer, points FROM member_points_award")))
            points: dict[str, int] = {
                str(c): int(p)
                for c, p in conn.execute(text("SELECT customer, points FROM member_points"))
            }
    finally:
        account.dispose()
        member.dispose()

    awards_per_order = Counter(order_id for order_id, _, _ in awards)
    paid_per_customer: Counter[str] = Counter()
    for customer, amount in paid.values():
        paid_per_customer[customer] += amount
    mismatched = len(
        [
            customer
            for customer in set(paid_per_customer) | set(points)
            if paid_per_customer.get(customer, 0) != points.get(customer, 0)
        ]
    )
    return LedgerReport(
        customers=int(customers[0]),
        initial_total=initial_total,
        balances_total=int(customers[1]),
        orders_paid=len(paid),
        amount_paid=sum(amount for _, amount in paid.values()),
        points_awarded=sum(int(p) for _, _, p in awards),
        orders_consumed=len(awards_per_order),
        lost=sum(1 for order_id in paid if order_id not in awards_per_order),
        phantom=sum(1 for order_id in awards_per_order if order_id not in paid),
        duplicate_effects=sum(n - 1 for n in awards_per_order.values() if n > 1),
        points_mismatched_customers=mismatched,
    )


def unrelayed(account_url: str) -> int:
    """How many messages the account service stored while the broker was down still wait for its relay."""
    account = create_engine(account_url)
    try:
        with account.connect() as conn:
            return int(conn.execute(text(
                f"SELECT count(*) FROM {STORED_MESSAGE} WHERE relayed_at IS NULL")).scalar_one())
    finally:
        account.dispose()
