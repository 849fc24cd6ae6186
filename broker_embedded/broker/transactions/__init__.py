"""Transactions: half messages, END_TRANSACTION, the book of open transactions, check-backs.

``service`` holds the rules (and the atomic-commit rule in its docstring), ``book`` the
open transactions, ``check_service`` the check-back rounds, ``ops`` the op records.
"""

from .book import HalfRef, Transaction, TransactionBook
from .check_service import CheckService
from .ops import OP_CHECK, OP_COMMIT, OP_PARK, OP_RECHECK, OP_ROLLBACK, Op, decode_op, encode_op
from .service import TransactionService

__all__ = [
    "OP_CHECK", "OP_COMMIT", "OP_PARK", "OP_RECHECK", "OP_ROLLBACK",
    "CheckService", "HalfRef", "Op", "Transaction", "TransactionBook", "TransactionService",
    "decode_op", "encode_op",
]
